// A TypeScript app for the apps tests, deployed as a ZIP or from a git repository.
import Kernel, { type KernelContext } from "@onkernel/sdk";
import { titleOf } from "./title.js";

const kernel = new Kernel();
const app = kernel.app("e2e-typescript");

interface TitleInput {
  url: string;
}

app.action("page-title", async (ctx: KernelContext, payload?: TitleInput) => {
  const title: string = await titleOf(kernel, payload!.url);
  return { title, invocation_id: ctx.invocation_id };
});

app.action("fail", async (_ctx: KernelContext) => {
  throw new Error("typescript says no");
});
