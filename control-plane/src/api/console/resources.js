// Pools, profiles, extensions, proxies, credentials, credential providers, auth
// connections, apps, deployments and invocations: a list and a page for each, with the
// create and edit forms the API allows. Secrets (passwords, tokens, TOTP seeds) are
// write-only: their inputs start empty, are never filled from the API (which never
// returns them), and an empty one changes nothing.

import {
  action, age, api, can, field, fields, follow, form, h, items, link, navigate, notFound, show, table,
} from './ui.js';

export const RESOURCES = {
  pools: { title: 'Pools', one: 'pool', path: '/browser_pools', kind: 'browser_pools' },
  profiles: { title: 'Profiles', one: 'profile', path: '/profiles', kind: 'profiles' },
  extensions: { title: 'Extensions', one: 'extension', path: '/extensions', kind: 'extensions' },
  proxies: { title: 'Proxies', one: 'proxy', path: '/proxies', kind: 'proxies' },
  credentials: { title: 'Credentials', one: 'credential', path: '/credentials', kind: 'credentials' },
  'credential-providers': { title: 'Credential providers', one: 'credential provider', path: '/org/credential_providers', kind: 'credential_providers' },
  'auth-connections': { title: 'Auth connections', one: 'auth connection', path: '/auth/connections', kind: 'auth_connections' },
  apps: { title: 'Apps', one: 'app', path: '/apps', kind: 'apps' },
  deployments: { title: 'Deployments', one: 'deployment', path: '/deployments', kind: 'deployments' },
  invocations: { title: 'Invocations', one: 'invocation', path: '/invocations', kind: 'invocations' },
};

// ---- Forms -------------------------------------------------------------------------------
//
// A field: `name` is where its value goes in the request body (dots nest: `config.host`),
// `read` where the current value is in the API's answer (default: `name`); `type` is an
// input type, or `list` (comma separated), `json` (parsed), `select` (with `options`),
// `file` (sent as multipart); `secret` fields are write-only.

const text = (name, label, extra = {}) => ({ name, label, type: 'text', ...extra });
const number = (name, label, extra = {}) => ({ name, label, type: 'number', ...extra });
const check = (name, label, extra = {}) => ({ name, label, type: 'checkbox', ...extra });
const secret = (name, label, extra = {}) => ({ name, label, type: 'password', secret: true, ...extra });

const POOL_FIELDS = (read) => [
  text('name', 'Name', { read: read('name') }),
  number('size', 'Size (browsers kept ready)', { required: true, min: 1, read: read('size') }),
  number('fill_rate_per_minute', 'Fill rate (browsers per minute)', { min: 1, read: read('fill_rate_per_minute') }),
  number('timeout_seconds', 'Idle timeout (seconds)', { min: 10, read: read('timeout_seconds') }),
  text('proxy_id', 'Proxy id', { read: read('proxy_id') }),
  check('headless', 'Headless', { read: read('headless') }),
  check('stealth', 'Stealth', { read: read('stealth') }),
];

const FORMS = {
  pools: {
    // The profile only at creation: a PATCH replaces the whole profile object, so one
    // sent back with its name alone would drop its other settings (`save_changes`).
    create: [...POOL_FIELDS(() => undefined), text('profile.name', 'Profile name')],
    edit: POOL_FIELDS((name) => `browser_pool_config.${name}`),
  },
  profiles: { create: [text('name', 'Name')], edit: [text('name', 'Name', { required: true })] },
  extensions: {
    create: [{ name: 'file', label: 'Extension (.zip)', type: 'file', accept: '.zip,application/zip', required: true },
      text('name', 'Name')],
    multipart: true,
    submit: 'Upload',
  },
  proxies: {
    create: [
      text('name', 'Name'),
      { name: 'type', label: 'Type', type: 'select', options: ['custom', 'isp', 'residential', 'mobile'], required: true },
      text('config.host', 'Host (custom)'), number('config.port', 'Port (custom)', { min: 1, max: 65535 }),
      text('config.username', 'Username (custom)'), secret('config.password', 'Password (custom; write-only)'),
      text('config.country', 'Country (isp, residential, mobile)'),
      text('bypass_hosts', 'Hosts that bypass the proxy (comma separated)', { type: 'list' }),
    ],
    edit: [text('name', 'Name', { required: true })],
  },
  credentials: {
    create: [
      text('name', 'Name', { required: true }), text('domain', 'Domain', { required: true }),
      text('values.username', 'Username'), secret('values.password', 'Password (write-only)'),
      secret('totp_secret', 'TOTP secret (write-only)'),
    ],
    edit: [
      text('name', 'Name'), text('values.username', 'Username (leave empty to keep)'),
      secret('values.password', 'New password (write-only; empty keeps the current one)'),
      secret('totp_secret', 'New TOTP secret (write-only; empty keeps the current one)'),
    ],
  },
  'credential-providers': {
    create: [
      text('name', 'Name', { required: true }),
      secret('token', '1Password Connect token (write-only)', { required: true }),
      number('cache_ttl_seconds', 'Cache time (seconds)', { min: 0 }),
    ],
    fixed: { provider_type: 'onepassword' },
    edit: [
      text('name', 'Name'), number('priority', 'Priority', { min: 0 }),
      number('cache_ttl_seconds', 'Cache time (seconds)', { min: 0 }), check('enabled', 'Enabled'),
      secret('token', 'New token (write-only; empty keeps the current one)'),
    ],
  },
  'auth-connections': {
    create: [
      text('domain', 'Domain', { required: true }), text('profile_name', 'Profile name', { required: true }),
      text('login_url', 'Login page URL', { type: 'url' }), text('credential.name', 'Credential name'),
      text('allowed_domains', 'Other domains the login may visit (comma separated)', { type: 'list' }),
    ],
    edit: [
      text('login_url', 'Login page URL', { type: 'url' }), text('credential.name', 'Credential name'),
      text('allowed_domains', 'Other domains the login may visit (comma separated)', { type: 'list' }),
      check('health_checks', 'Check the login regularly'), check('auto_reauth', 'Log in again when it expires'),
      check('save_credentials', 'Save what is typed as a credential'), check('record_session', 'Record logins'),
    ],
  },
  invocations: {
    create: [
      text('app_name', 'App', { required: true }), text('action_name', 'Action', { required: true }),
      text('version', 'Version', { required: true, value: 'latest' }),
      { name: 'payload', label: 'Payload (JSON text, optional)', type: 'textarea' },
    ],
    fixed: { async: true },
    submit: 'Invoke',
  },
};

const dig = (object, path) => path.split('.').reduce((at, key) => (at == null ? undefined : at[key]), object);

function put(object, path, value) {
  const keys = path.split('.');
  let at = object;
  for (const key of keys.slice(0, -1)) at = at[key] ??= {};
  at[keys[keys.length - 1]] = value;
}

/** The form's inputs; with `current`, filled from it (never a secret). */
function controls(specs, current) {
  return specs.map((spec) => {
    const value = current && !spec.secret ? dig(current, spec.read || spec.name) : undefined;
    const attrs = { required: spec.required, min: spec.min, max: spec.max, accept: spec.accept };
    if (spec.type === 'checkbox') return field(spec.label, spec.name, { ...attrs, type: 'checkbox', checked: Boolean(value) });
    if (spec.type === 'select') {
      const id = `f-${spec.name.replace(/\W/g, '-')}`;
      return h('div', {}, h('label', { for: id }, spec.label), h('select', { id, name: spec.name, ...attrs },
        spec.options.map((option) => h('option', { value: option, selected: option === value }, option))));
    }
    if (spec.type === 'textarea') {
      const id = `f-${spec.name.replace(/\W/g, '-')}`;
      return h('div', {}, h('label', { for: id }, spec.label), h('textarea', { id, name: spec.name, rows: 4, cols: 60 }));
    }
    const shown = Array.isArray(value) ? value.join(', ') : value ?? spec.value;
    return field(spec.label, spec.name, {
      ...attrs,
      type: spec.type === 'list' ? 'text' : spec.type,
      value: shown,
      autocomplete: spec.secret ? 'new-password' : null,
    });
  });
}

/** The request body of a submitted form: empty inputs are left out. */
function body(specs, values, fixed = {}) {
  const out = structuredClone(fixed);
  for (const spec of specs) {
    const value = values[spec.name];
    if (spec.type === 'checkbox') put(out, spec.name, value);
    else if (value === undefined || value === '' || (value instanceof File && !value.name)) continue;
    else if (spec.type === 'number') put(out, spec.name, Number(value));
    else if (spec.type === 'list') put(out, spec.name, value.split(',').map((item) => item.trim()).filter(Boolean));
    else put(out, spec.name, value);
  }
  return out;
}

function multipart(object) {
  const data = new FormData();
  for (const [name, value] of Object.entries(object)) data.append(name, value);
  return data;
}

function createForm(kind, resource) {
  const spec = FORMS[kind];
  if (!spec || !spec.create || !can(resource.kind, 'write')) return null;
  return h('details', { class: 'card' }, h('summary', {}, `New ${resource.one}`),
    form(`New ${resource.one}`, controls(spec.create), async (values) => {
      const request = body(spec.create, values, spec.fixed);
      const { data } = await api('POST', resource.path, spec.multipart ? multipart(request) : request);
      navigate(`/console/${kind}/${encodeURIComponent(idOf(data))}`);
    }, spec.submit || 'Create'));
}

function editForm(kind, resource, path, current, again) {
  const spec = FORMS[kind];
  if (!spec || !spec.edit || !can(resource.kind, 'write')) return null;
  return h('details', { class: 'card' }, h('summary', {}, `Edit the ${resource.one}`),
    form(`Edit the ${resource.one}`, controls(spec.edit, current), async (values) => {
      await api('PATCH', path, body(spec.edit, values));
      await again();
    }));
}

// ---- Pages -------------------------------------------------------------------------------

const idOf = (item) => item.id || item.session_id || item.name;

export async function resourceList(kind) {
  const resource = RESOURCES[kind];
  if (!resource) return notFound('This page');
  const { data } = await api('GET', resource.path);
  const rows = items(data).map((item) => h('tr', {},
    h('td', {}, link(`/console/${kind}/${encodeURIComponent(idOf(item))}`, item.name || item.app_name || item.domain || idOf(item))),
    h('td', {}, idOf(item)), h('td', {}, item.status || ''), h('td', {}, age(item.created_at || item.started_at))));
  show(resource.title, h('h1', {}, resource.title), createForm(kind, resource),
    table(['Name', 'Id', 'Status', 'Age'], rows, `No ${resource.title.toLowerCase()} yet.`));
}

export async function resourceDetail(kind, id) {
  const resource = RESOURCES[kind];
  if (!resource) return notFound('This page');
  const path = `${resource.path}/${encodeURIComponent(id)}`;
  const { data } = await api('GET', path);
  const again = () => resourceDetail(kind, id);
  const remove = can(resource.kind, 'write')
    ? action('Delete', async () => { await api('DELETE', path); navigate(`/console/${kind}`); }, 'danger') : null;
  // A deployment's build log and an invocation's events, followed live.
  const events = kind === 'deployments' || kind === 'invocations'
    ? h('pre', { id: 'events', tabindex: 0 }) : null;
  const title = data.name || data.domain || id;
  show(`${resource.title}: ${title}`, h('p', {}, link(`/console/${kind}`, `← ${resource.title}`)),
    h('h1', {}, title), remove, editForm(kind, resource, path, data, again),
    kind === 'auth-connections' ? await loginSections(path, data, again) : null,
    h('section', { class: 'card', 'aria-labelledby': 'details-title' }, h('h2', { id: 'details-title' }, 'Details'), fields(data)),
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

// ---- Auth connections --------------------------------------------------------------------

/** An auth connection's login: start one, watch and drive it in its live view while it
 * runs, and the timeline of past logins and health checks. */
async function loginSections(path, connection, again) {
  const running = connection.flow_status === 'IN_PROGRESS';
  const status = h('p', { id: 'login-status', 'aria-live': 'polite' },
    `Status: ${connection.status}${running ? ` · login ${String(connection.flow_step || '').toLowerCase()}` : ''}`);
  const view = h('div', {});
  let viewUrl = connection.live_view_url;
  // The flow's browser may not run yet when the flow starts: the view (a page of ours,
  // same origin) is loaded again at each event until it shows the screen.
  const showView = () => {
    const frame = view.firstChild;
    if (!viewUrl) return;
    if (!frame) {
      view.append(h('iframe', { class: 'view', id: 'login-view', title: 'Live view of the login', src: `${viewUrl}&embed=true` }));
    } else if (!(frame.contentWindow && frame.contentWindow.liveView)) {
      frame.src = `${viewUrl}&embed=true`;
    }
  };
  if (running) {
    showView();
    const log = h('pre', { hidden: true });
    follow(`${path}/events`, log, (event) => {
      if (event.event === 'managed_auth_state') {
        status.textContent = `Status: ${event.flow_status === 'IN_PROGRESS' ? `login ${String(event.flow_step || '').toLowerCase()}` : event.flow_status.toLowerCase()}`;
        viewUrl = event.live_view_url || viewUrl;
        if (event.flow_status !== 'IN_PROGRESS') setTimeout(() => status.isConnected && again(), 500);
      }
      showView();
      return null;
    }, ['managed_auth_state', 'sse_heartbeat']);
  }
  const start = can('auth_connections', 'use') && !running
    ? action('Log in now', async () => { await api('POST', `${path}/login`, {}); await again(); }) : null;
  const { data: timeline } = await api('GET', `${path}/timeline?limit=50`).catch(() => ({ data: [] }));
  const rows = items(timeline).map((event) => h('tr', {},
    h('td', {}, event.timestamp || ''), h('td', {}, event.type || ''), h('td', {}, event.status || ''),
    h('td', {}, event.step || ''), h('td', {}, event.error_message || event.website_error || ''),
    h('td', {}, event.browser_session_id ? link(`/console/sessions/${encodeURIComponent(event.browser_session_id)}`, 'browser') : '')));
  return [
    h('section', { class: 'card', 'aria-labelledby': 'login-title' }, h('h2', { id: 'login-title' }, 'Login'),
      status, start, connection.hosted_url && running ? h('p', {}, h('a', { href: connection.hosted_url }, 'The hosted login page')) : null,
      view),
    h('section', { class: 'card', 'aria-labelledby': 'timeline-title' }, h('h2', { id: 'timeline-title' }, 'Timeline'),
      table(['Time', 'Type', 'Status', 'Step', 'Problem', ''], rows, 'No logins or health checks yet.')),
  ];
}
