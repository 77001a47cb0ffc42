// A Playwright executor: one Node.js process per executor of a browser, started by the
// browser agent inside the VM and kept warm between calls. Each call runs users' code (a
// function body with `page`, `context` and `browser`) against the VM's Chromium over
// CDP. State lives as long as the process: `globalThis` keeps what a call puts there.
//
// Requests: {code, timeout_ms, cdp}, `cdp` the DevTools HTTP endpoint of the VM's
// Chromium (it changes when Chromium restarts). Environment: EXECUTOR_OWNS_TAB=1 for a
// named executor, which opens and keeps a tab of its own (the default executor binds
// `page` to the browser's active tab instead).

import { activePage, connected, disconnect, pageWithTarget, targetIdOf } from './browser.mjs';
import { BoundedText, answer, capturing, compileBody, describeError, jsonSafe, serve } from './protocol.mjs';

const ownsTab = process.env.EXECUTOR_OWNS_TAB === '1';

/** The target id of the tab a named executor owns. */
let ownedTarget = null;

/** The page a call binds: [page, created]. */
async function bindPage(browser) {
  const context = browser.contexts()[0];
  if (!ownsTab) return activePage(browser);
  if (ownedTarget) {
    const page = await pageWithTarget(browser, ownedTarget);
    if (page) return [page, false];
  }
  // A background tab: the window's active tab stays what it was.
  const session = await browser.newBrowserCDPSession();
  let targetId;
  try {
    ({ targetId } = await session.send('Target.createTarget', { url: 'about:blank', background: true }));
  } finally {
    session.detach().catch(() => {});
  }
  const deadline = Date.now() + 10_000;
  for (;;) {
    const page = await pageWithTarget(browser, targetId);
    if (page) {
      ownedTarget = targetId;
      return [page, true];
    }
    if (Date.now() > deadline) throw new Error('the executor\'s new tab did not appear');
    await context.waitForEvent('page', { timeout: 500 }).catch(() => {});
  }
}

class Timeout extends Error {}

async function execute({ code, timeout_ms: timeoutMs, cdp }) {
  const stdout = new BoundedText();
  const stderr = new BoundedText();
  const reply = { success: false };
  let timer;
  const expired = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Timeout()), timeoutMs);
  });
  try {
    await capturing(
      (channel, text) => (channel === 'stdout' ? stdout : stderr).push(text),
      async () => {
        const run = async () => {
          const fn = compileBody(['page', 'context', 'browser'], code);
          const current = await connected(cdp);
          const [page, created] = await bindPage(current);
          reply.tab = { target_id: await targetIdOf(page), created };
          const value = await fn(page, page.context(), current);
          reply.url = page.isClosed() ? undefined : page.url();
          return value;
        };
        reply.result = await jsonSafe(await Promise.race([run(), expired]));
        reply.success = true;
      },
    );
  } catch (error) {
    if (error instanceof Timeout) {
      disconnect();
      reply.error = `execution timed out after ${timeoutMs / 1000} s; the executor dropped its browser connection`;
      reply.timed_out = true;
    } else {
      reply.error = describeError(error);
      if (typeof error?.stack === 'string') stderr.push(`${error.stack}\n`);
    }
  } finally {
    clearTimeout(timer);
  }
  reply.stdout = stdout.toString();
  reply.stderr = stderr.toString();
  answer(reply);
}

serve(execute);
