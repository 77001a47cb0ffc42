// Usage: node seed_ops.mjs <base URL> <api key> <session id> <zip path>
// Runs the five seed operations of the browser agent's hands with the official TypeScript
// SDK, as a user would, and prints what get_mouse_position answered as JSON.
import Kernel, { toFile } from "@onkernel/sdk";
import { readFileSync } from "node:fs";

const [baseURL, apiKey, id, zipPath] = process.argv.slice(2);
const client = new Kernel({ apiKey, baseURL, maxRetries: 0 });

await client.browsers.fs.uploadZip(id, {
  dest_path: "/ts/unzipped",
  zip_file: await toFile(readFileSync(zipPath), "archive.zip"),
});
await client.browsers.fs.move(id, { src_path: "/ts/unzipped/hello.txt", dest_path: "/ts/moved.txt" });
await client.browsers.computer.clickMouse(id, { x: 610, y: 410, button: "right" });
await client.browsers.computer.dragMouse(id, {
  path: [[250, 450], [350, 500]],
  steps_per_segment: 4,
  step_delay_ms: 25,
});
const position = await client.browsers.computer.getMousePosition(id);
console.log(JSON.stringify({ x: position.x, y: position.y }));
