// The service's loader for JavaScript and TypeScript apps (it is not the app's code).
//
// `node boot.mjs describe ENTRYPOINT` imports the entrypoint and writes the apps and
// actions it registered with the SDK's app framework (`kernel.app("name")`,
// `app.action("name", handler)`) to the result file. `node boot.mjs invoke ENTRYPOINT APP
// ACTION` imports it and runs one action with the payload file's JSON, then writes the
// action's return value, as JSON, or the stack of what it threw.
import { existsSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { createRequire, register } from "node:module";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";

const RUN = "/run/app";
const RESULT = `${RUN}/result.json`;
const PAYLOAD = `${RUN}/payload.json`;

// TypeScript is compiled as it is imported (hooks.mjs).
register("./hooks.mjs", import.meta.url);

function writeResult(value) {
  writeFileSync(`${RESULT}.partial`, JSON.stringify(value));
  renameSync(`${RESULT}.partial`, RESULT);
}

/** The app framework's registries the app may have filled: the SDK's ES module and its
 * CommonJS build are two module instances, each with its own. */
async function registries() {
  const found = [];
  try {
    found.push((await import("kernel-app-registry:esm")).appRegistry);
  } catch {}
  try {
    found.push(createRequire("/app/package.json")("@onkernel/sdk").appRegistry);
  } catch {}
  return found.filter(Boolean);
}

async function main() {
  const [mode, entrypoint, appName, actionName] = process.argv.slice(2);
  await import(pathToFileURL(resolve("/app", entrypoint)).href);
  const apps = new Map();
  for (const registry of await registries()) {
    for (const app of registry.getApps()) apps.set(app.name, app);
  }
  if (mode === "describe") {
    return {
      ok: true,
      apps: [...apps.values()].map((app) => ({
        name: app.name,
        actions: app.getActions().map((action) => action.name),
      })),
    };
  }
  const action = apps.get(appName)?.getAction(actionName);
  if (!action) return { ok: false, error: `the app ${appName} has no action ${actionName}` };
  const text = existsSync(PAYLOAD) ? readFileSync(PAYLOAD, "utf8") : "";
  const payload = text ? JSON.parse(text) : undefined;
  const result = await action.handler({ invocation_id: process.env.KERNEL_INVOCATION_ID ?? "" }, payload);
  return { ok: true, output: JSON.stringify(result ?? null) };
}

let outcome;
try {
  outcome = await main();
} catch (error) {
  outcome = { ok: false, error: error instanceof Error ? (error.stack ?? String(error)) : String(error) };
}
writeResult(outcome);
// Handles the app left open (timers, sockets) must not keep the run going.
process.exit(0);
