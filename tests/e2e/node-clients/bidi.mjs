// Usage: node bidi.mjs <webdriver_ws_url> <page url>
// Connects with Puppeteer over WebDriver BiDi, opens the page in a new tab, prints its
// title and the protocol Puppeteer used as JSON.
import puppeteer from "puppeteer-core";

const [wsUrl, pageUrl] = process.argv.slice(2);
const browser = await puppeteer.connect({ browserWSEndpoint: wsUrl, protocol: "webDriverBiDi" });
const page = await browser.newPage();
await page.goto(pageUrl);
const title = await page.title();
await page.close();
await browser.disconnect();
console.log(JSON.stringify({ title, protocol: browser.protocol }));
