// What the VM's Node.js runners (executor.mjs, repl.mjs) share: the line protocol with the
// browser agent, capture of what users' code prints, and compiling users' TypeScript.
//
// The agent writes one JSON request per line on stdin and reads one JSON answer per line
// on stdout, each answer carrying its request's `id`. Users' code must not break that:
// everything written to process.stdout and process.stderr (console.* included) is
// captured for the call that runs, and only `answer` writes to the real stdout (a line
// that reaches it otherwise is skipped by the agent: it has no matching id).

import { createRequire } from 'node:module';
import readline from 'node:readline';

/** Output kept per stream and call; the rest is dropped and said so. */
export const MAX_OUTPUT_BYTES = 1024 * 1024;

const realStdoutWrite = process.stdout.write.bind(process.stdout);

/** Largest answer: a larger result is refused instead. */
export const MAX_ANSWER_BYTES = 32 * 1024 * 1024;

/** The id of the request being handled, which its answer carries back. */
let requestId = null;

/** Sends the answer to the request being handled. */
export function answer(message) {
  message = { ...message, id: requestId };
  let line = JSON.stringify(message);
  if (Buffer.byteLength(line) > MAX_ANSWER_BYTES) {
    line = JSON.stringify({
      ...message,
      success: false,
      result: undefined,
      content: undefined,
      error: `the answer would be larger than ${MAX_ANSWER_BYTES >> 20} MiB; return less`,
    });
  }
  // On a line of its own even after a stray write without a newline.
  realStdoutWrite(`\n${line}\n`);
}

/** What the running call printed; writes between calls are dropped. */
let sink = null;

for (const [name, stream] of [['stdout', process.stdout], ['stderr', process.stderr]]) {
  stream.write = (chunk, encoding, callback) => {
    if (typeof encoding === 'function') {
      callback = encoding;
      encoding = undefined;
    }
    const text = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8');
    sink?.(name, text);
    if (callback) queueMicrotask(callback);
    return true;
  };
}

/**
 * Calls `run` with everything printed meanwhile going to `onOutput(channel, text)`.
 */
export async function capturing(onOutput, run) {
  sink = onOutput;
  try {
    return await run();
  } finally {
    sink = null;
  }
}

/** A stream's text bounded at MAX_OUTPUT_BYTES (in UTF-16 units, close enough). */
export class BoundedText {
  text = '';
  truncated = false;

  push(text) {
    const room = MAX_OUTPUT_BYTES - this.text.length;
    if (text.length > room) {
      this.truncated = true;
      text = text.slice(0, Math.max(room, 0));
    }
    this.text += text;
  }

  toString() {
    return this.truncated ? `${this.text}\n[output past ${MAX_OUTPUT_BYTES} bytes dropped]\n` : this.text;
  }
}

/** Reads requests, one JSON object per line, and hands them to `handle` one at a time. */
export async function serve(handle) {
  const lines = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
  for await (const line of lines) {
    if (!line.trim()) continue;
    let request;
    try {
      request = JSON.parse(line);
    } catch (error) {
      answer({ success: false, error: `bad request from the agent: ${error.message}` });
      continue;
    }
    requestId = request.id ?? null;
    await handle(request);
  }
  // The agent closed our stdin: it is done with us.
  process.exit(0);
}

const AsyncFunction = (async () => {}).constructor;
const require = createRequire(import.meta.url);
let typescript = null;

/**
 * Compiles a function body (JavaScript or TypeScript, with `await` and `return`) into an
 * async function of `parameters`. TypeScript is compiled only when the code is not
 * JavaScript already: loading the compiler costs about 150 ms, once per process.
 */
export function compileBody(parameters, code) {
  try {
    return new AsyncFunction(...parameters, code);
  } catch (error) {
    if (!(error instanceof SyntaxError)) throw error;
    typescript ??= require('typescript');
    const { outputText, diagnostics } = typescript.transpileModule(code, {
      reportDiagnostics: true,
      compilerOptions: { target: typescript.ScriptTarget.ES2022, module: typescript.ModuleKind.ESNext },
    });
    const syntax = (diagnostics ?? []).find((d) => d.category === typescript.DiagnosticCategory.Error);
    if (syntax) {
      // Neither JavaScript nor TypeScript: the JavaScript engine's message is the clearer.
      throw error;
    }
    return new AsyncFunction(...parameters, outputText);
  }
}

/** A value as JSON can carry it: itself when it serializes, else its inspected text. */
export async function jsonSafe(value) {
  if (value === undefined) return undefined;
  try {
    return JSON.parse(JSON.stringify(value) ?? 'null');
  } catch {
    const { inspect } = await import('node:util');
    return inspect(value, { depth: 4 });
  }
}

/** An error as the API reports it. */
export function describeError(error) {
  // Errors of code run in another context are of its own Error class: no instanceof.
  if (typeof error?.message === 'string') return `${error.name ?? 'Error'}: ${error.message}`;
  return String(error);
}

// A promise users' code left unhandled, or an exception thrown from a callback, is
// reported with the call that runs (if any) instead of ending the process.
for (const event of ['unhandledRejection', 'uncaughtException']) {
  process.on(event, (error) => sink?.('stderr', `${event}: ${error?.stack ?? error}\n`));
}
