// dist/index.js: one ES module, no runtime dependencies (the .d.ts files come from tsc).
// --size: also report the minified + gzipped size of the bundle (what an app pays).
import { build } from "esbuild";
import { gzipSync } from "node:zlib";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const common = { entryPoints: [resolve(root, "src/index.ts")], bundle: true, format: "esm", platform: "neutral",
  target: "es2020", logLevel: "warning" };
await build({ ...common, outfile: resolve(root, "dist/index.js"), sourcemap: false });
if (process.argv.includes("--size")) {
  const out = await build({ ...common, write: false, minify: true, outfile: "index.min.js" });
  const code = out.outputFiles[0].contents;
  const gz = gzipSync(code, { level: 9 }).length;
  console.log(JSON.stringify({ minified_bytes: code.length, min_gzip_bytes: gz }));
}
// The demo page (GET /) loads the package from the server: keep the served copy in step.
// (Committed, so the server needs no Node; tests/test_js_client.py checks it matches a fresh build.)
import { copyFileSync } from "node:fs";
copyFileSync(resolve(root, "dist/index.js"), resolve(root, "../../server/switchboard/static/switchboard-client.js"));
