// Usage: node load_extensions.mjs <base URL> <api key> <session id> <name> <zip path>
// Loads one extension into a running browser with the official TypeScript SDK.
import Kernel, { toFile } from "@onkernel/sdk";
import { readFileSync } from "node:fs";

const [baseURL, apiKey, id, name, zipPath] = process.argv.slice(2);
const client = new Kernel({ apiKey, baseURL, maxRetries: 0, timeout: 120_000 });
await client.browsers.loadExtensions(id, {
  extensions: [{ name, zip_file: await toFile(readFileSync(zipPath), `${name}.zip`) }],
});
console.log(JSON.stringify({ loaded: name }));
