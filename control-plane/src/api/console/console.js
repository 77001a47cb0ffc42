// The console: a few modules of plain JavaScript (no framework, no build step) that read
// and change everything through the public API, same origin, as the signed-in principal
// (the session cookie is HttpOnly: no script here ever sees a key). This one signs in,
// draws the navigation and routes each path to its page.

import { auditPage, teamPage } from './team.js';
import { sessionPage, sessionsPage } from './browsers.js';
import { guarded, h, leavePage, main, navigate, notFound, session, show, api } from './ui.js';
import { hostPage } from './host.js';
import { resourceDetail, resourceList } from './resources.js';

const SECTIONS = [
  ['/console/sessions', 'Browsers'], ['/console/pools', 'Pools'], ['/console/profiles', 'Profiles'],
  ['/console/extensions', 'Extensions'], ['/console/proxies', 'Proxies'], ['/console/credentials', 'Credentials'],
  ['/console/credential-providers', 'Providers'], ['/console/auth-connections', 'Auth'], ['/console/apps', 'Apps'],
  ['/console/deployments', 'Deployments'], ['/console/invocations', 'Invocations'], ['/console/team', 'Team'],
];

document.addEventListener('click', (event) => {
  const anchor = event.target.closest('a[data-link]');
  if (!anchor || event.ctrlKey || event.metaKey || event.shiftKey || event.button !== 0) return;
  event.preventDefault();
  navigate(anchor.getAttribute('href'));
});
window.addEventListener('popstate', () => render());
window.addEventListener('console:navigate', () => render());
window.addEventListener('console:signed-out', (event) => signInPage(event.detail));

function chrome() {
  const { me } = session;
  const nav = document.getElementById('nav');
  const here = location.pathname;
  // The host page is for the host's operators only.
  const sections = me.operator ? [...SECTIONS, ['/console/host', 'Host']] : SECTIONS;
  nav.replaceChildren(h('ul', {}, sections.map(([href, text]) => h('li', {},
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
  session.me = null;
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
  if (!session.me) return;
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

async function start() {
  try {
    ({ data: session.me } = await api('GET', '/console/me'));
  } catch {
    const why = new URLSearchParams(location.search).get('sign_in');
    signInPage(why === 'invalid' ? 'That API key is not valid.' : why === 'expired' ? 'That API key has expired.' : '');
    return;
  }
  await render();
}

start();
