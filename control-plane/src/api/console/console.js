// The console: one page of plain JavaScript (no framework, no build step) that reads and
// changes everything through the public API, same origin, as the signed-in principal
// (the session cookie is HttpOnly: this script never sees a key). Text from the API is
// only ever set as text (`h` below), never parsed as HTML.

const main = document.getElementById('main');
let me = null;
/** Timers of the page shown, cleared when another is shown. */
let timers = [];
/** Streams (EventSource) of the page shown, closed when another is shown. */
let streams = [];

function leavePage() {
  for (const timer of timers) clearInterval(timer);
  for (const stream of streams) stream.close();
  timers = [];
  streams = [];
}

// ---- DOM -------------------------------------------------------------------------------

/** An element: `attrs` are attributes (`on…` ones are listeners), children are nodes or text. */
function h(tag, attrs = {}, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith('on')) element.addEventListener(name.slice(2), value);
    else element.setAttribute(name, value === true ? '' : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

const link = (href, ...text) => h('a', { href, 'data-link': true }, ...text);

function age(iso) {
  if (!iso) return '';
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  if (seconds < 129600) return `${Math.round(seconds / 3600)} h`;
  return `${Math.round(seconds / 86400)} d`;
}

function show(title, ...children) {
  document.title = `${title} · Console`;
  main.replaceChildren(...children);
}

function fields(object, keys) {
  return h('dl', { class: 'fields' }, (keys || Object.keys(object)).flatMap((key) => {
    const value = object[key];
    if (value === undefined) return [];
    const text = value !== null && typeof value === 'object' ? JSON.stringify(value) : String(value ?? '');
    return [h('dt', {}, key), h('dd', {}, text)];
  }));
}

function table(headers, rows, empty = 'Nothing here yet.') {
  if (!rows.length) return h('p', { class: 'muted' }, empty);
  return h('table', {}, h('thead', {}, h('tr', {}, headers.map((name) => h('th', { scope: 'col' }, name)))),
    h('tbody', {}, rows));
}

/** A form whose submit calls `action(values)`, showing its error instead of the form's state. */
function form(label, controls, action, submit = 'Save') {
  const error = h('p', { class: 'error', role: 'alert', hidden: true });
  const element = h('form', { 'aria-label': label }, controls, h('button', { type: 'submit' }, submit), error);
  element.addEventListener('submit', async (event) => {
    event.preventDefault();
    error.hidden = true;
    const values = Object.fromEntries(new FormData(element).entries());
    for (const box of element.querySelectorAll('input[type=checkbox]')) values[box.name] = box.checked;
    try {
      await action(values);
    } catch (failure) {
      error.textContent = failure.message;
      error.hidden = false;
    }
  });
  return element;
}

function field(label, name, attrs = {}) {
  const id = `f-${name}-${Math.random().toString(36).slice(2, 7)}`;
  if (attrs.type === 'checkbox') {
    return h('label', { class: 'inline', for: id }, h('input', { id, name, ...attrs }), label);
  }
  return h('div', {}, h('label', { for: id }, label), h('input', { id, name, ...attrs }));
}

function action(text, run, kind = 'secondary') {
  const button = h('button', { type: 'button', class: kind }, text);
  button.addEventListener('click', async () => {
    button.disabled = true;
    try {
      await run();
    } catch (failure) {
      alertMessage(failure.message);
    } finally {
      button.disabled = false;
    }
  });
  return button;
}

function alertMessage(text) {
  const existing = document.getElementById('page-error');
  const element = existing || h('p', { id: 'page-error', class: 'error', role: 'alert' });
  element.textContent = text;
  if (!existing) main.prepend(element);
}

// ---- API -------------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

async function api(method, path, body) {
  const init = { method, credentials: 'same-origin', headers: { Accept: 'application/json' } };
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = text;
  }
  if (response.status === 401 && path !== '/console/me') {
    signInPage('Your session ended: sign in again.');
  }
  if (!response.ok) {
    throw new ApiError(response.status, (data && data.message) || `${response.status} ${response.statusText}`);
  }
  return { data, headers: response.headers };
}

const items = (data) => (Array.isArray(data) ? data : (data && (data.items || data.data)) || []);
const can = (kind, verb) => Boolean(me && me.can[kind] && me.can[kind][verb]);

function notFound(what) {
  show('Not found', h('h1', {}, 'Not found'),
    h('p', {}, `${what} does not exist, or is not yours to see.`), link('/console/sessions', 'Back to the browsers'));
}

/** Runs a page, turning a 404 into the not-found page and other failures into a message. */
async function guarded(what, page) {
  try {
    await page();
  } catch (failure) {
    if (failure.status === 404) notFound(what);
    else if (failure.status !== 401) show('Error', h('h1', {}, 'Something went wrong'), h('p', { class: 'error' }, failure.message));
  }
}

// ---- Navigation ------------------------------------------------------------------------

const SECTIONS = [
  ['/console/sessions', 'Browsers'], ['/console/pools', 'Pools'], ['/console/profiles', 'Profiles'],
  ['/console/extensions', 'Extensions'], ['/console/proxies', 'Proxies'], ['/console/credentials', 'Credentials'],
  ['/console/auth-connections', 'Auth'], ['/console/apps', 'Apps'], ['/console/deployments', 'Deployments'],
  ['/console/invocations', 'Invocations'],
  ['/console/team', 'Team'], ['/console/host', 'Host'],
];

function navigate(path, replace = false) {
  if (replace) history.replaceState(null, '', path);
  else history.pushState(null, '', path);
  render();
}

document.addEventListener('click', (event) => {
  const anchor = event.target.closest('a[data-link]');
  if (!anchor || event.ctrlKey || event.metaKey || event.shiftKey || event.button !== 0) return;
  event.preventDefault();
  navigate(anchor.getAttribute('href'));
});
window.addEventListener('popstate', () => render());

function chrome() {
  const nav = document.getElementById('nav');
  const here = location.pathname;
  nav.replaceChildren(h('ul', {}, SECTIONS.map(([href, text]) => h('li', {},
    h('a', { href, 'data-link': true, 'aria-current': here.startsWith(href) ? 'page' : null }, text)))));
  nav.hidden = false;
  const who = document.getElementById('who');
  const role = me.principal.role ? ` (${me.principal.role})` : '';
  who.replaceChildren(h('span', {}, `${me.name || me.principal.id || ''}${role}`),
    h('form', { method: 'post', action: '/console/sign-out' }, h('button', { type: 'submit', class: 'secondary' }, 'Sign out')));
}

/** The shell's own sign-in form (with the identity provider's link when the server has
 * one), kept to be shown again whenever the session ends. */
const signInSection = document.getElementById('sign-in');

function signInPage(message) {
  me = null;
  leavePage();
  document.getElementById('nav').hidden = true;
  document.getElementById('who').replaceChildren();
  signInSection.querySelector('form').reset();
  const error = signInSection.querySelector('#sign-in-error');
  error.textContent = message || '';
  error.hidden = !message;
  show('Sign in', signInSection);
}

const ROUTES = [
  [/^\/console\/?$/, () => navigate('/console/sessions', true)],
  [/^\/console\/sessions$/, () => guarded('Browsers', sessionsPage)],
  [/^\/console\/sessions\/([^/]+)$/, (id) => guarded(`Browser ${id}`, () => sessionPage(id))],
  [/^\/console\/team$/, () => guarded('Team', () => teamPage())],
  [/^\/console\/team\/audit$/, () => guarded('The audit log', auditPage)],
  [/^\/console\/host$/, () => guarded('Host', hostPage)],
  [/^\/console\/([a-z-]+)$/, (kind) => guarded(kind, () => resourceList(kind))],
  [/^\/console\/([a-z-]+)\/([^/]+)$/, (kind, id) => guarded(`${kind} ${id}`, () => resourceDetail(kind, id))],
];

async function render() {
  leavePage();
  if (!me) return;
  chrome();
  for (const [pattern, page] of ROUTES) {
    const match = location.pathname.match(pattern);
    if (match) {
      await page(...match.slice(1).map(decodeURIComponent));
      main.focus({ preventScroll: true });
      // For the `console` bench: when the page's data is on screen.
      performance.mark('console-rendered');
      return;
    }
  }
  notFound('This page');
}

// ---- Browsers --------------------------------------------------------------------------

const TELEMETRY = { browser: { console: { enabled: true }, network: { enabled: true }, page: { enabled: true } } };

async function sessionsPage() {
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
  timers.push(setInterval(() => {
    for (const image of main.querySelectorAll('img[data-thumb]')) {
      image.src = `/console/thumbnails/${encodeURIComponent(image.dataset.thumb)}?t=${Date.now()}`;
    }
  }, 3000));
}

async function sessionPage(id) {
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
 * `pre`, at most `keep` lines kept. */
function follow(url, pre, line, names = [], keep = 500) {
  const stream = new EventSource(url);
  streams.push(stream);
  const append = (message) => {
    let data;
    try {
      data = JSON.parse(message.data);
    } catch {
      data = { message: message.data };
    }
    const text = line(data);
    if (text === null) return;
    pre.append(document.createTextNode(`${text}\n`));
    while (pre.childNodes.length > keep) pre.firstChild.remove();
    pre.scrollTop = pre.scrollHeight;
  };
  for (const name of ['message', ...names]) stream.addEventListener(name, append);
  stream.onerror = () => stream.close();
  return stream;
}

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

const decode = (b64) => new TextDecoder().decode(Uint8Array.from(atob(b64 || ''), (c) => c.charCodeAt(0)));

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

// ---- Other resources -------------------------------------------------------------------

const RESOURCES = {
  pools: { title: 'Pools', path: '/browser_pools', kind: 'browser_pools' },
  profiles: { title: 'Profiles', path: '/profiles', kind: 'profiles' },
  extensions: { title: 'Extensions', path: '/extensions', kind: 'extensions' },
  proxies: { title: 'Proxies', path: '/proxies', kind: 'proxies' },
  credentials: { title: 'Credentials', path: '/credentials', kind: 'credentials' },
  'credential-providers': { title: 'Credential providers', path: '/org/credential_providers', kind: 'credential_providers' },
  'auth-connections': { title: 'Auth connections', path: '/auth/connections', kind: 'auth_connections' },
  apps: { title: 'Apps', path: '/apps', kind: 'apps' },
  deployments: { title: 'Deployments', path: '/deployments', kind: 'deployments' },
  invocations: { title: 'Invocations', path: '/invocations', kind: 'invocations' },
};

const idOf = (item) => item.id || item.session_id || item.name;

async function resourceList(kind) {
  const resource = RESOURCES[kind];
  if (!resource) return notFound('This page');
  const { data } = await api('GET', resource.path);
  const rows = items(data).map((item) => h('tr', {},
    h('td', {}, link(`/console/${kind}/${encodeURIComponent(idOf(item))}`, item.name || item.app_name || idOf(item))),
    h('td', {}, idOf(item)), h('td', {}, item.status || ''), h('td', {}, age(item.created_at || item.started_at))));
  show(resource.title, h('h1', {}, resource.title),
    table(['Name', 'Id', 'Status', 'Age'], rows, `No ${resource.title.toLowerCase()} yet.`));
}

async function resourceDetail(kind, id) {
  const resource = RESOURCES[kind];
  if (!resource) return notFound('This page');
  const path = `${resource.path}/${encodeURIComponent(id)}`;
  const { data } = await api('GET', path);
  const remove = can(resource.kind, 'write')
    ? action('Delete', async () => { await api('DELETE', path); navigate(`/console/${kind}`); }, 'danger') : null;
  // A deployment's build log and an invocation's events, followed live.
  const events = kind === 'deployments' || kind === 'invocations'
    ? h('pre', { id: 'events', tabindex: 0 }) : null;
  show(`${resource.title}: ${data.name || id}`, h('p', {}, link(`/console/${kind}`, `← ${resource.title}`)),
    h('h1', {}, data.name || id), remove, h('section', { class: 'card' }, fields(data)),
    events ? h('section', { class: 'card', 'aria-labelledby': 'events-title' },
      h('h2', { id: 'events-title' }, kind === 'deployments' ? 'Build log' : 'Events'), events) : null);
  if (events) {
    follow(`${path}/events`, events, (event) => {
      if (event.event === 'log') return `${event.timestamp || ''} ${(event.log && event.log.message) || event.message || ''}`;
      if (event.event === 'sse_heartbeat') return null;
      const state = event.deployment || event.invocation;
      return `${event.timestamp || ''} ${event.event}${state ? `: ${state.status}` : ''}`;
    }, ['log', 'deployment_state', 'invocation_state', 'app_version_summary', 'error']);
  }
}

// ---- Team ------------------------------------------------------------------------------

/** The team: keys, projects, limits, usage. `revealed`: a key's secret just made, shown once. */
async function teamPage(revealed = null) {
  const sections = [h('h1', {}, 'Team'), h('p', {}, link('/console/team/audit', 'The audit log'))];
  const secret = h('div', { 'aria-live': 'polite' }, revealed ? h('div', { class: 'notice' },
    h('p', {}, `${revealed.what} Copy it now: it is not shown again.`),
    h('code', { class: 'secret', id: 'new-secret' }, revealed.key)) : null);
  if (can('api_keys', 'read')) {
    const { data } = await api('GET', '/org/api_keys');
    const write = can('api_keys', 'write');
    const rows = items(data).map((key) => h('tr', {}, h('td', {}, key.name), h('td', {}, key.masked_key || ''),
      h('td', {}, key.project_id || 'every project'), h('td', {}, age(key.created_at)), h('td', {}, key.last_used_at ? age(key.last_used_at) : 'never'),
      h('td', {}, write ? [
        action('Rotate', async () => {
          const { data: made } = await api('POST', `/org/api_keys/${key.id}/rotate`, {});
          await teamPage({ key: made.key, what: `The new secret of ${key.name}.` });
        }),
        action('Revoke', async () => { await api('DELETE', `/org/api_keys/${key.id}`); await teamPage(); }, 'danger'),
      ] : '')));
    sections.push(h('h2', {}, 'API keys'), secret,
      write ? form('New API key', [field('Name', 'name', { type: 'text', required: true })], async (values) => {
        const { data: made } = await api('POST', '/org/api_keys', { name: values.name });
        await teamPage({ key: made.key, what: `The secret of ${values.name}.` });
      }, 'Create key') : null,
      table(['Name', 'Key', 'Project', 'Age', 'Last used', ''], rows, 'No keys.'));
  }
  if (can('projects', 'read')) {
    const { data } = await api('GET', '/org/projects').catch(() => ({ data: [] }));
    sections.push(h('h2', {}, 'Projects'), table(['Name', 'Id', 'Status'], items(data).map((p) =>
      h('tr', {}, h('td', {}, p.name), h('td', {}, p.id), h('td', {}, p.status || '')))));
  }
  if (can('organization', 'read')) {
    const { data } = await api('GET', '/org/limits').catch(() => ({ data: null }));
    if (data) sections.push(h('h2', {}, 'Limits'), h('div', { class: 'card' }, fields(data)));
  }
  sections.push(h('h2', {}, 'Usage'), await usageChart());
  show('Team', ...sections);
}

/** The items of a list, page after page (of 100), at most 1,000. */
async function everyItem(path) {
  const found = [];
  const joiner = path.includes('?') ? '&' : '?';
  for (let offset = 0, pages = 0; pages < 10; pages += 1) {
    const { data, headers } = await api('GET', `${path}${joiner}limit=100&offset=${offset}`);
    found.push(...items(data));
    if (headers.get('x-has-more') !== 'true') break;
    offset = Number(headers.get('x-next-offset') || offset + 100);
  }
  return found;
}

/** Browser-hours and invocations per day over the last week, from the lists (a page at a
 * time, at most 1,000 of each). */
async function usageChart() {
  const days = [...Array(7)].map((_, i) => {
    const start = new Date();
    start.setHours(0, 0, 0, 0);
    start.setDate(start.getDate() - (6 - i));
    return { start: start.getTime(), end: start.getTime() + 86400000, hours: 0, invocations: 0 };
  });
  if (can('invocations', 'read')) {
    for (const invocation of await everyItem('/invocations')) {
      const at = Date.parse(invocation.started_at);
      const day = days.find((d) => d.start <= at && at < d.end);
      if (day) day.invocations += 1;
    }
  }
  let live = 0;
  for (const b of await everyItem('/browsers?status=all')) {
    const from = Date.parse(b.created_at);
    const to = b.deleted_at ? Date.parse(b.deleted_at) : Date.now();
    if (!b.deleted_at) live += 1;
    for (const day of days) day.hours += Math.max(0, Math.min(to, day.end) - Math.max(from, day.start)) / 3600000;
  }
  const chart = (label, value, unit) => {
    const most = Math.max(0.01, ...days.map(value));
    return h('div', { class: 'chart', role: 'img', 'aria-label': `${label}: ${days.map((d) => value(d).toFixed(unit === 'h' ? 1 : 0)).join(', ')}` },
      days.map((day) => {
        const bar = h('div', { title: `${new Date(day.start).toDateString()}: ${value(day).toFixed(unit === 'h' ? 1 : 0)} ${unit}` });
        bar.style.height = `${Math.round((value(day) / most) * 100)}%`; // CSSOM, which the CSP allows
        return bar;
      }));
  };
  return h('figure', { class: 'card' },
    h('p', {}, 'Browser-hours per day'), chart('Browser-hours per day', (d) => d.hours, 'h'),
    h('p', {}, 'Invocations per day'), chart('Invocations per day', (d) => d.invocations, 'invocations'),
    h('figcaption', {}, `The last 7 days, oldest first. Live browsers now: ${live}.`));
}

async function auditPage() {
  const query = new URLSearchParams(location.search);
  const end = new Date();
  const start = new Date(end.getTime() - Number(query.get('hours') || 24) * 3600000);
  const params = new URLSearchParams({ start: start.toISOString(), end: end.toISOString(), limit: '100' });
  for (const name of ['method', 'search', 'page_token']) if (query.get(name)) params.set(name, query.get(name));
  const { data, headers } = await api('GET', `/audit-logs?${params}`);
  const filters = h('form', { class: 'filters', role: 'search', 'aria-label': 'Filter the audit log' },
    h('div', {}, h('label', { for: 'audit-method' }, 'Method'), h('select', { id: 'audit-method', name: 'method' },
      ['', 'GET', 'POST', 'PATCH', 'PUT', 'DELETE'].map((m) => h('option', { value: m, selected: m === (query.get('method') || '') }, m || 'any')))),
    h('div', {}, h('label', { for: 'audit-search' }, 'Search'), h('input', { id: 'audit-search', name: 'search', type: 'search', value: query.get('search') || '' })),
    h('div', {}, h('label', { for: 'audit-hours' }, 'Hours back'), h('input', { id: 'audit-hours', name: 'hours', type: 'number', min: 1, value: query.get('hours') || 24 })),
    h('button', { type: 'submit' }, 'Filter'));
  filters.addEventListener('submit', (event) => {
    event.preventDefault();
    const values = new URLSearchParams([...new FormData(filters)].filter(([, v]) => v));
    navigate(`/console/team/audit?${values}`);
  });
  const rows = items(data).map((e) => h('tr', {}, h('td', {}, e.timestamp), h('td', {}, e.method), h('td', {}, e.path),
    h('td', {}, String(e.status)), h('td', {}, e.email || e.api_key_id || e.auth_strategy || '')));
  const next = headers.get('x-next-page-token');
  show('Audit log', h('p', {}, link('/console/team', '← Team')), h('h1', {}, 'Audit log'), filters,
    table(['Time', 'Method', 'Path', 'Status', 'Who'], rows, 'No calls in this window.'),
    next ? h('div', { class: 'pager' }, link(`/console/team/audit?${new URLSearchParams({ ...Object.fromEntries(query), page_token: next })}`, 'Older')) : null);
}

async function hostPage() {
  const response = await fetch('/readyz', { credentials: 'same-origin' });
  const report = await response.json().catch(() => ({}));
  show('Host', h('h1', {}, 'Host'), h('p', {}, response.ok ? 'Ready.' : 'Not ready.'),
    h('section', { class: 'card' }, h('h2', {}, 'Readiness and isolation'), h('pre', { tabindex: 0 }, JSON.stringify(report, null, 2))));
}

// ---- Start -----------------------------------------------------------------------------

async function start() {
  try {
    ({ data: me } = await api('GET', '/console/me'));
  } catch {
    const why = new URLSearchParams(location.search).get('sign_in');
    signInPage(why === 'invalid' ? 'That API key is not valid.' : why === 'expired' ? 'That API key has expired.' : '');
    return;
  }
  await render();
}

start();
