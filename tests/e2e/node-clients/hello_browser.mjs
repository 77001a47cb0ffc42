// The "hello-browser" loop of the public remote-browser benchmark (BrowserArena,
// nottelabs/browserarena): create a session with the official TypeScript SDK, connect
// Playwright over CDP, open the first page (or a new one) and go to a URL until
// DOMContentLoaded, release the session with the SDK. Each stage is timed on its own.
// Written here from the benchmark's published method (not its code), for the
// `lifecycle` bench scenario.
//
//   node hello_browser.mjs '{"target": "ours", "baseURL": …, "apiKey": …, "url": …,
//                            "runs": 20, "warmup": 10, "concurrency": 1, "headless": true,
//                            "intervalMs": 1500}'
//   node hello_browser.mjs '{"target": "bare", "chromium": "/usr/bin/chromium", …}'
//   node hello_browser.mjs '{"target": "prelaunched", "chromium": …, "settleMs": 5000, …}'
//
// One JSON line per timed session on stdout: {create_ms, connect_ms, goto_ms,
// release_ms, ok, error}. A session (or batch) starts `intervalMs` after the previous one
// started at the earliest, as the benchmark throttles a service. `bare` is the reference: a
// Chromium this script launches itself (launch until its DevTools URL is printed, connect,
// goto, kill until it exits). `prelaunched`, the reference for batches: Chromiums launched
// and left to settle before each batch (or session) is timed, so its create is nothing.

import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

import Kernel from '@onkernel/sdk';
import { chromium } from 'playwright-core';

const options = JSON.parse(process.argv[2]);
const since = (started) => Number(process.hrtime.bigint() - started) / 1e6;

/** How the session is made and ended: through our API, or a Chromium of our own. */
function target() {
  if (options.target === 'ours') {
    const kernel = new Kernel({ apiKey: options.apiKey, baseURL: options.baseURL, maxRetries: 0 });
    return {
      create: async () => {
        const made = await kernel.browsers.create({ headless: options.headless });
        return { id: made.session_id, cdpUrl: made.cdp_ws_url };
      },
      release: (session) => kernel.browsers.deleteByID(session.id),
    };
  }
  const release = (session) => new Promise((resolve) => {
    session.child.once('exit', () => {
      rmSync(session.dir, { recursive: true, force: true, maxRetries: 10, retryDelay: 10 });
      resolve();
    });
    process.kill(-session.child.pid, 'SIGKILL');
  });
  if (options.target === 'prelaunched') {
    // The ideal standby: Chromiums launched and settled before the timer starts, so a
    // create is only handing one over; what is timed is connect, goto and the kill.
    const ready = [];
    return {
      prepare: async (count) => {
        for (let i = 0; i < count; i += 1) ready.push(await launchChromium());
        await new Promise((resolve) => setTimeout(resolve, options.settleMs || 5000));
      },
      create: async () => ready.shift(),
      release,
    };
  }
  return { create: launchChromium, release };
}

/** A Chromium of our own, once its DevTools URL is printed. */
function launchChromium() {
  return new Promise((resolve, reject) => {
    const dir = mkdtempSync(join(tmpdir(), 'hello-browser-'));
    // The flags a service would give it too (no background traffic, no first-run UI).
    const args = ['--remote-debugging-address=127.0.0.1', '--remote-debugging-port=0', `--user-data-dir=${dir}`,
      '--no-first-run', '--no-default-browser-check', '--disable-background-networking',
      '--disable-component-update', '--disable-sync', '--password-store=basic', '--disable-gpu', '--no-sandbox',
      'about:blank'];
    if (options.headless) args.unshift('--headless');
    // Its own process group, so that the kill takes its zygote and renderers too.
    const child = spawn(options.chromium, args, { stdio: ['ignore', 'ignore', 'pipe'], detached: true });
    let text = '';
    child.stderr.on('data', (chunk) => {
      text += chunk;
      const found = text.match(/DevTools listening on (ws:\/\/\S+)/);
      if (found) resolve({ id: String(child.pid), cdpUrl: found[1], child, dir });
    });
    child.on('exit', () => reject(new Error(`chromium exited before listening: ${text.slice(-500)}`)));
  });
}

async function once(how) {
  const record = { create_ms: null, connect_ms: null, goto_ms: null, release_ms: null, ok: false, error: null };
  let session = null;
  let stage = 'create';
  try {
    let started = process.hrtime.bigint();
    session = await how.create();
    record.create_ms = since(started);
    stage = 'connect';
    started = process.hrtime.bigint();
    const browser = await chromium.connectOverCDP(session.cdpUrl);
    record.connect_ms = since(started);
    stage = 'goto';
    started = process.hrtime.bigint();
    const context = browser.contexts()[0] || (await browser.newContext());
    const page = context.pages()[0] || (await context.newPage());
    await page.goto(options.url, { waitUntil: 'domcontentloaded' });
    record.goto_ms = since(started);
    record.ok = true;
  } catch (error) {
    record.error = `${stage}: ${error && error.message ? error.message.split('\n')[0] : error}`;
  } finally {
    if (session) {
      const started = process.hrtime.bigint();
      try {
        await how.release(session);
        record.release_ms = since(started);
      } catch (error) {
        record.ok = false;
        record.error = `release: ${error.message}`;
      }
    }
  }
  return record;
}

/** Waits until `intervalMs` have passed since `started` (the benchmark's throttle). */
async function throttle(started) {
  const left = (options.intervalMs || 0) - (Date.now() - started);
  if (left > 0) await new Promise((resolve) => setTimeout(resolve, left));
}

const how = target();
for (let i = 0; i < options.warmup; i += 1) {
  if (how.prepare) await how.prepare(1);
  const started = Date.now();
  await once(how);
  await throttle(started);
}
for (let i = 0; i < options.runs; i += 1) {
  if (how.prepare) await how.prepare(options.concurrency);
  const started = Date.now();
  const records = await Promise.all(Array.from({ length: options.concurrency }, () => once(how)));
  for (const record of records) process.stdout.write(`${JSON.stringify(record)}\n`);
  await throttle(started);
}
// Playwright's connections stay open until their browser ends (as in the benchmark).
process.exit(0);
