// What every page of the console uses: building elements, calling the API, following
// a stream, moving between pages. The pages are modules of their own (`browsers.js`,
// `resources.js`, `team.js`, `host.js`); `console.js` routes between them. Text from
// the API is only ever set as text (`h` below), never parsed as HTML.

export const main = document.getElementById('main');
/** Who is signed in (`/console/me`), set by `console.js`. */
export const session = { me: null };
/** Timers of the page shown, cleared when another is shown. */
const timers = [];
/** Streams (EventSource) of the page shown, closed when another is shown. */
const streams = [];

export function leavePage() {
  for (const timer of timers.splice(0)) clearInterval(timer);
  for (const stream of streams.splice(0)) stream.close();
}

/** Runs `run` every `ms` while the page is shown. */
export function every(ms, run) {
  timers.push(setInterval(run, ms));
}

// ---- DOM -------------------------------------------------------------------------------

/** An element: `attrs` are attributes (`on…` ones are listeners), children are nodes or text. */
export function h(tag, attrs = {}, ...children) {
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

export const link = (href, ...text) => h('a', { href, 'data-link': true }, ...text);

export function age(iso) {
  if (!iso) return '';
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  if (seconds < 129600) return `${Math.round(seconds / 3600)} h`;
  return `${Math.round(seconds / 86400)} d`;
}

export function show(title, ...children) {
  document.title = `${title} · Console`;
  main.replaceChildren(...children.flat().filter((child) => child !== null && child !== undefined && child !== false));
}

export function fields(object, keys) {
  return h('dl', { class: 'fields' }, (keys || Object.keys(object)).flatMap((key) => {
    const value = object[key];
    if (value === undefined) return [];
    const text = value !== null && typeof value === 'object' ? JSON.stringify(value) : String(value ?? '');
    return [h('dt', {}, key), h('dd', {}, text)];
  }));
}

export function table(headers, rows, empty = 'Nothing here yet.') {
  if (!rows.length) return h('p', { class: 'muted' }, empty);
  return h('table', {}, h('thead', {}, h('tr', {}, headers.map((name) => h('th', { scope: 'col' }, name)))),
    h('tbody', {}, rows));
}

/** A form whose submit calls `action(values)`, showing its error instead of the form's state. */
export function form(label, controls, action, submit = 'Save') {
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

export function field(label, name, attrs = {}) {
  const id = `f-${name}-${Math.random().toString(36).slice(2, 7)}`;
  if (attrs.type === 'checkbox') {
    return h('label', { class: 'inline', for: id }, h('input', { id, name, ...attrs }), label);
  }
  return h('div', {}, h('label', { for: id }, label), h('input', { id, name, ...attrs }));
}

export function action(text, run, kind = 'secondary') {
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

export function alertMessage(text) {
  const existing = document.getElementById('page-error');
  const element = existing || h('p', { id: 'page-error', class: 'error', role: 'alert' });
  element.textContent = text;
  if (!existing) main.prepend(element);
}

// ---- API -------------------------------------------------------------------------------

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export async function api(method, path, body) {
  const init = { method, credentials: 'same-origin', headers: { Accept: 'application/json' } };
  if (body instanceof FormData) {
    init.body = body; // multipart: the browser writes its Content-Type
  } else if (body !== undefined) {
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
    window.dispatchEvent(new CustomEvent('console:signed-out', { detail: 'Your session ended: sign in again.' }));
  }
  if (!response.ok) {
    throw new ApiError(response.status, (data && data.message) || `${response.status} ${response.statusText}`);
  }
  return { data, headers: response.headers };
}

export const items = (data) => (Array.isArray(data) ? data : (data && (data.items || data.data)) || []);
export const can = (kind, verb) => Boolean(session.me && session.me.can[kind] && session.me.can[kind][verb]);

export function notFound(what) {
  show('Not found', h('h1', {}, 'Not found'),
    h('p', {}, `${what} does not exist, or is not yours to see.`), link('/console/sessions', 'Back to the browsers'));
}

/** Runs a page, turning a 404 into the not-found page and other failures into a message. */
export async function guarded(what, page) {
  try {
    await page();
  } catch (failure) {
    if (failure.status === 404) notFound(what);
    else if (failure.status !== 401) show('Error', h('h1', {}, 'Something went wrong'), h('p', { class: 'error' }, failure.message));
  }
}

// ---- Moving between pages ----------------------------------------------------------------

/** Shows `path` (the router in `console.js` listens). */
export function navigate(path, replace = false) {
  if (replace) history.replaceState(null, '', path);
  else history.pushState(null, '', path);
  window.dispatchEvent(new Event('console:navigate'));
}

// ---- Streams -----------------------------------------------------------------------------

export function follow(url, pre, line, names = [], keep = 500) {
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


export const decode = (b64) => new TextDecoder().decode(Uint8Array.from(atob(b64 || ''), (c) => c.charCodeAt(0)));

/** The items of a list, page after page (of 100), at most 1,000. */
export async function everyItem(path) {
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

