// Bundle size of @switchboard/client against the four anchors, every one built the same way:
// esbuild (clients/js's own copy) bundles entries/<name>.js -- the imports a chat client needs --
// minified, ESM, platform browser, target es2020; the output gzipped at level 9. Also the
// package as `node clients/js/scripts/build.mjs --size` builds it (its whole API, platform neutral).
//   cd bench/js-anchors && npm ci && node size.mjs [--out ../results/js-anchors.json]
import { createRequire } from "node:module";
import { readFileSync, writeFileSync } from "node:fs";
import { gzipSync } from "node:zlib";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const js = resolve(here, "../../clients/js");
const { build } = createRequire(resolve(js, "package.json"))("esbuild");
const esbuildVersion = JSON.parse(readFileSync(resolve(js, "node_modules/esbuild/package.json"))).version;
const version = (p) => JSON.parse(readFileSync(resolve(here, "node_modules", p, "package.json"))).version;

async function size(entry, extra = {}) {
  const out = await build({ entryPoints: [entry], bundle: true, write: false, minify: true, format: "esm",
    platform: "browser", target: "es2020", outfile: "out.js", logLevel: "error", ...extra });
  const code = out.outputFiles[0].contents;
  return { minified_bytes: code.length, min_gzip_bytes: gzipSync(code, { level: 9 }).length };
}

const rows = {};
rows["@switchboard/client"] = { version: JSON.parse(readFileSync(resolve(js, "package.json"))).version,
  entry: "SwitchboardClient", ...(await size(resolve(here, "entries/switchboard.js"))) };
rows["@switchboard/client (whole API)"] = { entry: "export * from src/index.ts",
  ...(await size(resolve(js, "src/index.ts"))) };
for (const [name, pkg, entry] of [["phoenix", "phoenix", "Socket, Presence"],
  ["socket.io-client", "socket.io-client", "io"], ["@supabase/realtime-js", "@supabase/realtime-js", "RealtimeClient"],
  ["centrifuge", "centrifuge", "Centrifuge"]]) {
  const file = name === "@supabase/realtime-js" ? "realtime-js" : name;
  rows[name] = { version: version(pkg), entry, ...(await size(resolve(here, `entries/${file}.js`))) };
}
const result = { esbuild: esbuildVersion, settings: "bundle, minify, format esm, platform browser, target es2020, gzip -9",
  node: process.version, sizes: rows };
console.log(JSON.stringify(result, null, 2));
const i = process.argv.indexOf("--out");
if (i > 0) writeFileSync(process.argv[i + 1], JSON.stringify(result, null, 2) + "\n");
