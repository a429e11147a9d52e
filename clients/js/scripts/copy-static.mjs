// The demo page (GET /) and /console load the package from the server
// (GET /switchboard-client.js): copy the built bundle into the server's tree. A step of
// its own, not part of `npm run build` (the package builds without the server's tree):
// `npm run copy:static` (or `npm run regen`) after a change, then commit the copy, so the
// server needs no Node. tests/test_js_client.py fails while it differs from a fresh build.
import { copyFileSync, existsSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const target = resolve(root, "../../server/switchboard/static/switchboard-client.js");
if (!existsSync(dirname(target))) {
  console.error(`copy-static: ${dirname(target)} not found (run this in a Switchboard checkout)`);
  process.exit(1);
}
copyFileSync(resolve(root, "dist/index.js"), target);
console.log(`copy-static: dist/index.js -> ${target}`);
