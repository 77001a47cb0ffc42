// Usage: node page_all.mjs <base URL> <api key> <resource> <limit>
// (resource: profiles, browsers, auth.connections, extensions, proxies or browser_pools)
// Auto-pages a list with the official TypeScript SDK, as a user would, and prints the ids
// it saw as JSON. Stops after 500 items: a server that pages wrong would loop forever.
import Kernel from "@onkernel/sdk";

const [baseURL, apiKey, resource, limit] = process.argv.slice(2);
const client = new Kernel({ apiKey, baseURL, maxRetries: 0 });
const lists = {
  profiles: (query) => client.profiles.list(query),
  browsers: (query) => client.browsers.list({ ...query, status: "all" }),
  "auth.connections": (query) => client.auth.connections.list(query),
  extensions: (query) => client.extensions.list(query),
  proxies: (query) => client.proxies.list(query),
  browser_pools: (query) => client.browserPools.list(query),
};
const ids = [];
for await (const item of lists[resource]({ limit: Number(limit) })) {
  ids.push(item.id ?? item.session_id);
  if (ids.length >= 500) break;
}
console.log(JSON.stringify(ids));
