// What the VM's Node.js runners share about the browser: one Playwright connection to
// the VM's Chromium over CDP, and which page is which tab.

import { chromium } from 'playwright-core';

let browser = null;
let endpoint = null;
const targetIds = new WeakMap();

/** The connection to the Chromium at `cdp` (its DevTools HTTP endpoint), made anew
 *  when it dropped or Chromium moved (a restart changes its port). */
export async function connected(cdp) {
  if (browser?.isConnected() && cdp === endpoint) return browser;
  disconnect();
  endpoint = cdp;
  browser = await chromium.connectOverCDP(endpoint);
  return browser;
}

/** Drops the connection (Chromium keeps running). */
export function disconnect() {
  const dropped = browser;
  browser = null;
  dropped?.close().catch(() => {});
}

/** The CDP target id of a page's tab. */
export async function targetIdOf(page) {
  let id = targetIds.get(page);
  if (!id) {
    const session = await page.context().newCDPSession(page);
    try {
      id = (await session.send('Target.getTargetInfo')).targetInfo.targetId;
    } finally {
      session.detach().catch(() => {});
    }
    targetIds.set(page, id);
  }
  return id;
}

export async function pageWithTarget(browser, targetId) {
  for (const context of browser.contexts()) {
    for (const page of context.pages()) {
      if (!page.isClosed() && (await targetIdOf(page).catch(() => null)) === targetId) return page;
    }
  }
  return null;
}

/** The browser's active tab: [page, created]. DevTools lists pages most recently active
 *  first; a browser without pages gets a new one. */
export async function activePage(browser) {
  const listed = await (await fetch(`${endpoint}/json/list`)).json();
  const active = listed.find((target) => target.type === 'page');
  const page = active && (await pageWithTarget(browser, active.id));
  if (page) return [page, false];
  const any = browser.contexts().flatMap((c) => c.pages())[0];
  if (any) return [any, false];
  return [await browser.contexts()[0].newPage(), true];
}
