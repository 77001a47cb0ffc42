// The browsers: the list (filters, paging, live thumbnails) and one browser's page
// (live view, replays, inspector, files, logs, commands, actions).

import {
  action, age, api, can, decode, every, field, fields, follow, form, h, items, link, main, navigate, show, table,
} from './ui.js';

const TELEMETRY = { browser: { console: { enabled: true }, network: { enabled: true }, page: { enabled: true } } };

export async function sessionsPage() {
  const query = new URLSearchParams(location.search);
  const status = query.get('status') || 'active';
  const search = query.get('query') || '';
  const offset = Number(query.get('offset') || 0);
  const params = new URLSearchParams({ status, limit: '50', offset: String(offset) });
  if (search) params.set('query', search);
  const { data, headers } = await api('GET', `/browsers?${params}`);
  const browsers = items(data);
  const filters = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter browsers' },
    h('div', {}, h('label', { for: 'filter-status' }, 'Status'),
      h('select', { id: 'filter-status', name: 'status' }, ['active', 'all', 'deleted'].map((value) =>
        h('option', { value, selected: value === status }, value)))),
    h('div', {}, h('label', { for: 'filter-query' }, 'Search'),
      h('input', { id: 'filter-query', name: 'query', type: 'search', value: search, placeholder: 'id, name, profile, proxy, pool' })),
    h('button', { type: 'submit' }, 'Filter'));
  filters.addEventListener('submit', (event) => {
    event.preventDefault();
    const values = new URLSearchParams(new FormData(filters));
    if (!values.get('query')) values.delete('query');
    navigate(`/console/sessions?${values}`);
  });
  const rows = browsers.map((b) => {
    const ended = Boolean(b.deleted_at);
    const screen = !ended && !b.headless
      ? h('img', { class: 'thumb', 'data-thumb': b.session_id, alt: `Screen of ${b.name || b.session_id}`, loading: 'lazy',
        src: `/console/thumbnails/${encodeURIComponent(b.session_id)}` })
      : h('div', { class: 'thumb none' }, ended ? 'ended' : 'headless');
    return h('tr', { 'data-session': b.session_id }, h('td', {}, screen),
      h('td', {}, link(`/console/sessions/${encodeURIComponent(b.session_id)}`, b.name || b.session_id),
        b.name ? h('div', { class: 'muted' }, b.session_id) : null),
      h('td', {}, h('span', { class: `status ${ended ? 'ended' : 'running'}` }, ended ? 'ended' : 'running')),
      h('td', {}, age(b.created_at)),
      h('td', {}, (b.profile && b.profile.name) || ''), h('td', {}, b.proxy_id || ''),
      h('td', {}, (b.pool && b.pool.name) || ''),
      h('td', {}, Object.entries(b.tags || {}).map(([k, v]) => h('span', { class: 'tag' }, `${k}=${v}`))));
  });
  // The same filters, another page (an empty search is no search: the plain listing).
  const pageAt = (at) => `/console/sessions?${new URLSearchParams({ status, ...(search ? { query: search } : {}), offset: String(at) })}`;
  const pager = h('div', { class: 'pager' },
    offset > 0 ? link(pageAt(Math.max(0, offset - 50)), 'Newer') : null,
    headers.get('x-has-more') === 'true' ? link(pageAt(headers.get('x-next-offset') || offset + 50), 'Older') : null);
  const create = can('browsers', 'use') ? h('details', { class: 'card' }, h('summary', {}, 'New browser'),
    form('New browser', [
      field('Name (optional)', 'name', { type: 'text' }),
      field('Headless (no screen, no live view)', 'headless', { type: 'checkbox' }),
      field('Capture console, network and page events (telemetry)', 'telemetry', { type: 'checkbox', checked: true }),
    ], async (values) => {
      const body = { headless: values.headless };
      if (values.name) body.name = values.name;
      if (values.telemetry) body.telemetry = TELEMETRY;
      const { data: made } = await api('POST', '/browsers', body);
      navigate(`/console/sessions/${encodeURIComponent(made.session_id)}`);
    }, 'Create')) : null;
  show('Browsers', h('h1', {}, 'Browsers'), create, filters,
    table(['Screen', 'Browser', 'Status', 'Age', 'Profile', 'Proxy', 'Pool', 'Tags'], rows, 'No browsers match.'), pager);
  // Live thumbnails: the server takes one at most every 3 seconds.
  every(3000, () => {
    for (const image of main.querySelectorAll('img[data-thumb]')) {
      image.src = `/console/thumbnails/${encodeURIComponent(image.dataset.thumb)}?t=${Date.now()}`;
    }
  });
}

export async function sessionPage(id) {
  const path = `/browsers/${encodeURIComponent(id)}`;
  const { data: b } = await api('GET', `${path}?include_deleted=true`);
  const ended = Boolean(b.deleted_at);
  const use = can('browsers', 'use') && !ended;
  const { data: replayList } = await api('GET', `${path}/replays`).catch(() => ({ data: [] }));
  const replays = items(replayList);
  const recording = replays.find((r) => !r.finished_at);
  const again = () => sessionPage(id);
  const actions = use ? h('div', {},
    action('Stop the browser', async () => { await api('DELETE', path); await again(); }, 'danger'),
    recording
      ? action('Stop recording', async () => { await api('POST', `${path}/replays/${recording.replay_id}/stop`); await again(); })
      : action('Start recording', async () => { await api('POST', `${path}/replays`, {}); await again(); })) : null;
  const edit = use ? h('details', { class: 'card' }, h('summary', {}, 'Edit name, tags and viewport'),
    form('Edit the browser', [
      field('Name', 'name', { type: 'text', value: b.name || '' }),
      field('Tags (key=value, comma separated)', 'tags', {
        type: 'text', value: Object.entries(b.tags || {}).map(([k, v]) => `${k}=${v}`).join(', '),
      }),
      b.headless ? null : field('Viewport width', 'width', { type: 'number', value: b.viewport.width, min: 320 }),
      b.headless ? null : field('Viewport height', 'height', { type: 'number', value: b.viewport.height, min: 240 }),
    ], async (values) => {
      const tags = Object.fromEntries(values.tags.split(',').map((pair) => pair.trim()).filter(Boolean)
        .map((pair) => { const at = pair.indexOf('='); return at < 0 ? [pair, ''] : [pair.slice(0, at).trim(), pair.slice(at + 1).trim()]; }));
      const body = { name: values.name || null, tags };
      if (!b.headless && (Number(values.width) !== b.viewport.width || Number(values.height) !== b.viewport.height)) {
        body.viewport = { width: Number(values.width), height: Number(values.height) };
      }
      await api('PATCH', path, body);
      await again();
    })) : null;
  const liveUrl = use ? b.browser_live_view_url : b.browser_live_view_read_only_url;
  const live = !ended && liveUrl
    ? h('iframe', { class: 'view', id: 'live-view', title: `Live view of ${b.name || b.session_id}`, src: `${liveUrl}&embed=true` })
    : h('p', { class: 'muted' }, ended ? 'The browser has ended.' : 'A headless browser has no screen to watch.');
  const replayRows = replays.map((r) => {
    const video = `${path}/replays/${encodeURIComponent(r.replay_id)}`;
    return h('tr', {}, h('td', {}, r.replay_id), h('td', {}, r.started_at || ''), h('td', {}, r.finished_at || 'recording'),
      h('td', {}, r.finished_at ? h('video', { controls: true, preload: 'metadata', src: video, 'aria-label': `Replay ${r.replay_id}` }) : ''),
      h('td', {}, r.finished_at ? h('a', { href: video, download: `${r.replay_id}.mp4` }, 'Download') : ''));
  });
  show(b.name || b.session_id,
    h('p', {}, link('/console/sessions', '← Browsers')),
    h('h1', {}, b.name || b.session_id, ' ', h('span', { class: `status ${ended ? 'ended' : 'running'}` }, ended ? 'ended' : 'running')),
    actions, edit,
    h('div', { class: 'grid' },
      h('section', { class: 'card', 'aria-labelledby': 'live-title' }, h('h2', { id: 'live-title' }, 'Live view'), live),
      h('section', { class: 'card', 'aria-labelledby': 'config-title' }, h('h2', { id: 'config-title' }, 'Configuration'),
        fields(b, ['session_id', 'name', 'created_at', 'deleted_at', 'end_reason', 'headless', 'stealth', 'timeout_seconds',
          'viewport', 'profile', 'proxy_id', 'pool', 'region', 'tags', 'telemetry', 'start_url']))),
    h('section', { class: 'card', 'aria-labelledby': 'replays-title' }, h('h2', { id: 'replays-title' }, 'Replays'),
      table(['Replay', 'Started', 'Finished', 'Play', ''], replayRows, 'No replays.')),
    h('section', { class: 'card', 'aria-labelledby': 'inspector-title' }, h('h2', { id: 'inspector-title' }, 'Inspector'),
      h('iframe', { class: 'inspector', id: 'inspector', title: 'Telemetry inspector', src: b.inspector_url })),
    ended ? null : await filesSection(path, '/tmp'),
    use ? logsSection(path) : null,
    use ? commandSection(path) : null);
}

/** Server-sent events of `url` (unnamed, or named one of `names`) as lines appended to
/** The tail of one of the VM's service logs, followed live. */
function logsSection(path) {
  const pre = h('pre', { id: 'log-tail', tabindex: 0 });
  let stream = null;
  const select = h('select', { id: 'log-service', name: 'service' },
    ['chromium', 'agent', 'xvfb', 'playwright', 'webdriver'].map((name) => h('option', { value: name }, name)));
  const open = () => {
    if (stream) stream.close();
    pre.replaceChildren();
    const query = new URLSearchParams({ source: 'supervisor', supervisor_process: select.value, follow: 'true' });
    stream = follow(`${path}/logs/stream?${query}`, pre, (data) => data.message ?? null, ['log']);
  };
  select.addEventListener('change', open);
  open();
  return h('section', { class: 'card', 'aria-labelledby': 'logs-title' }, h('h2', { id: 'logs-title' }, 'Logs'),
    h('label', { for: 'log-service' }, 'Service'), select, pre);
}


/** Runs a command in the VM (the process API) and shows what it printed. */
function commandSection(path) {
  const output = h('pre', { id: 'command-output', tabindex: 0, hidden: true });
  return h('section', { class: 'card', 'aria-labelledby': 'command-title' }, h('h2', { id: 'command-title' }, 'Run a command'),
    form('Run a command in the browser\'s VM', [field('Command line (runs in sh -c)', 'command', { type: 'text', required: true })],
      async (values) => {
        const { data } = await api('POST', `${path}/process/exec`, { command: values.command, timeout_sec: 60 });
        output.textContent = `exit ${data.exit_code}${data.timed_out ? ' (timed out)' : ''}\n${decode(data.stdout_b64)}${decode(data.stderr_b64)}`;
        output.hidden = false;
      }, 'Run'), output);
}

/** The VM's files under `dir`, through the fs API: browse and download. */
async function filesSection(path, dir) {
  const section = h('section', { class: 'card', 'aria-labelledby': 'files-title' }, h('h2', { id: 'files-title' }, 'Files'));
  const list = async (where) => {
    let entries = [];
    try {
      ({ data: entries } = await api('GET', `${path}/fs/list_files?${new URLSearchParams({ path: where })}`));
    } catch (failure) {
      section.replaceChildren(section.firstChild, h('p', { class: 'muted' }, failure.message));
      return;
    }
    const parent = where.replace(/\/[^/]+\/?$/, '') || '/';
    const rows = items(entries).map((entry) => h('tr', {},
      h('td', {}, entry.is_dir
        ? h('button', { type: 'button', class: 'secondary', onclick: () => list(entry.path) }, `${entry.name}/`)
        : h('a', { href: `${path}/fs/read_file?${new URLSearchParams({ path: entry.path })}`, download: entry.name }, entry.name)),
      h('td', {}, entry.is_dir ? '' : `${entry.size_bytes ?? ''}`), h('td', {}, entry.mod_time || '')));
    section.replaceChildren(section.firstChild, h('p', {}, `In ${where} `,
      where !== '/' ? h('button', { type: 'button', class: 'secondary', onclick: () => list(parent) }, 'Up') : null),
    table(['Name', 'Bytes', 'Changed'], rows, 'Empty.'));
  };
  await list(dir);
  return section;
}
