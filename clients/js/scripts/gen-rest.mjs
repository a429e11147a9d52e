// Generates src/rest.ts (the REST types) from the server's OpenAPI document with
// openapi-typescript. The document is what GET /openapi.json serves; it is taken
// from the server's source (switchboard.openapi.openapi_document) so no server
// needs to run: `npm run gen:rest` (needs python3 with the server's dependencies).
// Pass a URL or a file to use another source: `node scripts/gen-rest.mjs http://host/openapi.json`.
import { execFileSync } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
let source = process.argv[2];
if (!source) {
  const json = execFileSync(process.env.PYTHON || "python3", ["-c",
    "import json, switchboard.openapi as o; print(json.dumps(o.openapi_document(), indent=1))"],
    { env: { ...process.env, PYTHONPATH: resolve(root, "../../server") }, encoding: "utf8" });
  source = join(mkdtempSync(join(tmpdir(), "sb-openapi-")), "openapi.json");
  writeFileSync(source, json);
}
execFileSync(process.execPath, [resolve(root, "node_modules/openapi-typescript/bin/cli.js"), source,
  "--output", resolve(root, "src/rest.ts")], { stdio: "inherit" });
