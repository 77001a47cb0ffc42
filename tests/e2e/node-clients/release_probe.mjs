import Kernel from '@onkernel/sdk';
import { chromium } from 'playwright-core';
const [baseURL, apiKey, url] = process.argv.slice(2);
const kernel = new Kernel({ apiKey, baseURL, maxRetries: 0 });
for (const closeFirst of [false, true, false, true]) {
  const times = [];
  for (let i = 0; i < 12; i += 1) {
    await new Promise((r) => setTimeout(r, 1500));
    const made = await kernel.browsers.create({ headless: true });
    const browser = await chromium.connectOverCDP(made.cdp_ws_url);
    const context = browser.contexts()[0] || await browser.newContext();
    const page = context.pages()[0] || await context.newPage();
    await page.goto(url, { waitUntil: 'domcontentloaded' });
    if (closeFirst) await browser.close();
    const t = process.hrtime.bigint();
    await kernel.browsers.deleteByID(made.session_id);
    times.push(Number(process.hrtime.bigint() - t) / 1e6);
  }
  times.sort((a, b) => a - b);
  console.log(closeFirst ? 'playwright closed first' : 'playwright connected', times[6].toFixed(1), times.map((t) => t.toFixed(1)).join(' '));
}
process.exit(0);
