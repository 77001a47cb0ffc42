// Module hooks of the service's loader for JavaScript and TypeScript apps: TypeScript
// files are compiled as they are imported (with the service's own `typescript`, types
// are not checked), `./x.js` imports find `./x.ts`, and `kernel-app-registry:esm` is the
// app's own `@onkernel/sdk`.
import { readFile } from "node:fs/promises";
import { createRequire } from "node:module";

const TYPESCRIPT = /\.(ts|mts|cts)$/;
let typescript;

function compiler() {
  typescript ??= createRequire("/opt/browser-agent/node/package.json")("typescript");
  return typescript;
}

export async function resolve(specifier, context, next) {
  if (specifier === "kernel-app-registry:esm") {
    return next("@onkernel/sdk", { ...context, parentURL: "file:///app/package.json" });
  }
  try {
    return await next(specifier, context);
  } catch (error) {
    const relative = specifier.startsWith(".") || specifier.startsWith("/");
    if (error?.code !== "ERR_MODULE_NOT_FOUND" || !relative) throw error;
    const candidates = [
      specifier.replace(/\.js$/, ".ts"),
      specifier.replace(/\.mjs$/, ".mts"),
      `${specifier}.ts`,
      `${specifier}/index.ts`,
    ];
    for (const candidate of candidates) {
      if (candidate === specifier) continue;
      try {
        return await next(candidate, context);
      } catch {}
    }
    throw error;
  }
}

export async function load(url, context, next) {
  if (!url.startsWith("file:") || !TYPESCRIPT.test(new URL(url).pathname)) {
    return next(url, context);
  }
  const ts = compiler();
  const source = await readFile(new URL(url), "utf8");
  const { outputText } = ts.transpileModule(source, {
    fileName: new URL(url).pathname,
    compilerOptions: {
      module: ts.ModuleKind.ESNext,
      target: ts.ScriptTarget.ES2022,
      esModuleInterop: true,
      sourceMap: false,
    },
  });
  return { format: "module", source: outputText, shortCircuit: true };
}
