// Usage: node connect.mjs <cdp_ws_url> <page url>
// Connects with Puppeteer's browserWSEndpoint, opens the page, prints its title as JSON.
import puppeteer from "puppeteer-core";

const [wsUrl, pageUrl] = process.argv.slice(2);
const browser = await puppeteer.connect({ browserWSEndpoint: wsUrl });
const page = await browser.newPage();
await page.goto(pageUrl);
const title = await page.title();
await page.close();
await browser.disconnect();
console.log(JSON.stringify({ title }));
