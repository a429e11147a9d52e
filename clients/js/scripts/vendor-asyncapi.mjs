// The server's side of the package's build inputs: copies the AsyncAPI document the
// server serves (server/switchboard/static/asyncapi.json, the one source) into the
// package (asyncapi.json), so that `npm run build` and `npm pack` read nothing outside
// clients/js. Run it (or `npm run regen`) after changing the document, and commit both;
// tests/test_js_package.py fails while they differ.
import { copyFileSync, existsSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const source = resolve(root, "../../server/switchboard/static/asyncapi.json");
if (!existsSync(source)) {
  console.error(`vendor-asyncapi: ${source} not found (run this in a Switchboard checkout)`);
  process.exit(1);
}
copyFileSync(source, resolve(root, "asyncapi.json"));
console.log(`vendor-asyncapi: ${source} -> asyncapi.json`);
