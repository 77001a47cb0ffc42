import type Kernel from "@onkernel/sdk";

/** Opens `url` in a new browser of this invocation and answers the page's title. */
export async function titleOf(kernel: Kernel, url: string): Promise<string> {
  const browser = await kernel.browsers.create({ headless: true });
  const response = await kernel.browsers.playwright.execute(browser.session_id, {
    code: `await page.goto(${JSON.stringify(url)}); return await page.title();`,
  });
  return response.result as string;
}
