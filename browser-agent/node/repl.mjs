// The browser's REPL (`/browsers/{id}/repl`): one Node.js process per VM, started by the
// agent on the first call and kept until a reset, a timeout or a crash. Code is evaluated
// as Node's own REPL evaluates it (node:repl's evaluator: top-level `await`, and
// top-level bindings that persist between calls), with `page`, `context` and `browser`
// bound to the VM's Chromium over CDP and `repl.write` / `repl.emitImage` for output.
// Expression values are not output; console output is (channels stdout and stderr).
//
// Requests: {code, cdp}. Answers: {success, content, content_truncated, error, stack}.

import domain from 'node:domain';
import repl from 'node:repl';
import { Console } from 'node:console';
import { PassThrough, Writable } from 'node:stream';
import { activePage, connected } from './browser.mjs';
import { MAX_OUTPUT_BYTES, answer, capturing, describeError, serve } from './protocol.mjs';

/** Images kept per call (bytes of their base64 together). */
const MAX_IMAGE_BYTES = 16 * 1024 * 1024;

let content = [];
let textBytes = 0;
let imageBytes = 0;
let truncated = false;

function emitText(channel, text) {
  if (!text) return;
  const room = MAX_OUTPUT_BYTES - textBytes;
  if (text.length > room) {
    truncated = true;
    text = text.slice(0, Math.max(room, 0));
    if (!text) return;
  }
  textBytes += text.length;
  const last = content[content.length - 1];
  if (last?.type === 'text' && last.channel === channel) last.text += text;
  else content.push({ type: 'text', channel, text });
}

function emitImage(data, mimeType = 'image/png') {
  const base64 = typeof data === 'string' ? data : Buffer.from(data).toString('base64');
  if (imageBytes + base64.length > MAX_IMAGE_BYTES) {
    truncated = true;
    return;
  }
  imageBytes += base64.length;
  content.push({ type: 'image', data_b64: base64, mime_type: String(mimeType) });
}

const channel = (name) =>
  new Writable({
    write(chunk, _encoding, done) {
      emitText(name, chunk.toString());
      done();
    },
  });

// Errors of evaluated code reach the REPL's domain rather than the evaluator's callback.
const errors = domain.create();
let failCall = null;
errors.on('error', (error) => {
  if (failCall) failCall(error);
  else emitText('stderr', `${error?.stack ?? error}\n`);
});

const server = repl.start({
  input: new PassThrough(),
  output: new PassThrough(),
  terminal: false,
  useGlobal: false,
  prompt: '',
  domain: errors,
});
const scope = server.context;
scope.console = new Console({ stdout: channel('stdout'), stderr: channel('stderr') });
scope.repl = {
  write: (text) => emitText('write', String(text)),
  emitImage,
};

/** Binds `browser`, `context` and `page` (the active tab) for this call. */
async function bindBrowser(cdp) {
  const browser = await connected(cdp);
  const [page] = await activePage(browser);
  Object.assign(scope, { browser, context: page.context(), page });
}

function evaluate(code) {
  return new Promise((resolve) => {
    failCall = (error) => resolve({ error });
    server.eval(code, scope, 'repl', (error) => resolve({ error }));
  }).finally(() => {
    failCall = null;
  });
}

async function run({ code, cdp }) {
  content = [];
  textBytes = 0;
  imageBytes = 0;
  truncated = false;
  const reply = { success: false };
  await capturing(emitText, async () => {
    try {
      await bindBrowser(cdp);
      if (code.trim()) {
        const { error } = await evaluate(code);
        if (error) {
          // An incomplete input is what the REPL calls recoverable: a syntax error here.
          reply.error =
            error.name === 'Recoverable'
              ? `SyntaxError: ${error.err?.message || 'Unexpected end of input'}`
              : describeError(error);
          if (typeof error?.stack === 'string') reply.stack = error.stack;
          return;
        }
      }
      reply.success = true;
    } catch (error) {
      reply.error = describeError(error);
      if (typeof error?.stack === 'string') reply.stack = error.stack;
    }
  });
  reply.content = content;
  if (truncated) reply.content_truncated = true;
  answer(reply);
}

serve(run);
