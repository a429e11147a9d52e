// dist/index.js: one ES module, no runtime dependencies (the .d.ts files come from tsc).
// Reads and writes only the package's own files (npm pack runs it through prepack, in a
// checkout or in a copy of this directory alone); `npm run copy:static` puts the bundle
// into the server's tree, a separate step.
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
