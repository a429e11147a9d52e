// The API lists in the docs against the generated .d.ts (dist/, from `npm run build`): every public
// member of SwitchboardClient and of a room handle, every event of ClientEvents, every option of
// ClientOptions and every exported error class must be listed, and nothing listed may be missing
// from the .d.ts. The lists are the Markdown tables whose first header cell says what they list
// ("member", "event", "room member", "option", "error class"); each name is taken from a
// `code span` of the table's first column (`connect()` / `disconnect()` gives both,
// `tools.register(name, fn)` gives tools). Checked: the package README (what npm shows) and
// docs/how-to/frontend.md (when the package sits in its Switchboard checkout).
import assert from "node:assert/strict";
import { existsSync, readFileSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import ts from "typescript";

const root = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const DOCS = [resolve(root, "README.md"), resolve(root, "../../docs/how-to/frontend.md")].filter(existsSync);

function declarations(file) {
  const src = ts.createSourceFile(file, readFileSync(resolve(root, "dist", file), "utf8"), ts.ScriptTarget.ES2022, true);
  const found = new Map();
  const visit = (n) => {
    if ((ts.isClassDeclaration(n) || ts.isInterfaceDeclaration(n)) && n.name) found.set(n.name.text, n);
    ts.forEachChild(n, visit);
  };
  visit(src);
  return found;
}

/** Public, named members of a class or interface (no constructor, no private/protected). */
function members(node) {
  const out = new Set();
  for (const m of node.members) {
    if (!m.name || ts.isConstructorDeclaration(m)) continue;
    const flags = ts.getCombinedModifierFlags(m);
    if (flags & (ts.ModifierFlags.Private | ts.ModifierFlags.Protected)) continue;
    if (ts.isPrivateIdentifier(m.name)) continue;
    out.add(m.name.getText().replace(/^["']|["']$/g, ""));
  }
  return out;
}

/** What the .d.ts declares, per list kind. */
function fromDts() {
  const client = declarations("client.d.ts");
  const room = declarations("room.d.ts");
  const index = readFileSync(resolve(root, "dist/index.d.ts"), "utf8");
  const exported = new Set([...index.matchAll(/\b([A-Z]\w*Error)\b/g)].map((m) => m[1]));
  // Exported and a class (declared `class X ... extends ...Error`), not only a type.
  const errorClasses = new Set();
  for (const f of ["errors.d.ts", "http.d.ts", "stream.d.ts"]) {
    for (const [name, node] of declarations(f)) if (ts.isClassDeclaration(node) && exported.has(name)) errorClasses.add(name);
  }
  return {
    member: members(client.get("SwitchboardClient")),
    event: members(client.get("ClientEvents")),
    option: members(client.get("ClientOptions")),
    "room member": members(room.get("SwitchboardRoom")),
    "error class": errorClasses,
  };
}

/** The names each kind of table lists in a Markdown file. */
function fromDoc(file) {
  const lists = {};
  const lines = readFileSync(file, "utf8").split("\n");
  let inCode = false;
  for (let i = 0; i < lines.length; i++) {
    if (/^```/.test(lines[i])) inCode = !inCode;
    if (inCode || !/^\|/.test(lines[i]) || !/^\|\s*-/.test(lines[i + 1] ?? "")) continue;
    const kind = lines[i].split("|")[1].trim();
    const names = (lists[kind] ??= new Set());
    for (i += 2; i < lines.length && /^\|/.test(lines[i]); i++) {
      const first = lines[i].replace(/\\\|/g, "/").split("|")[1];
      for (const [, span] of first.matchAll(/`([^`]+)`/g)) {
        const m = /^(?:new\s+)?(?:sb\.)?([A-Za-z_$][\w$]*)/.exec(span);
        if (m) names.add(m[1]);
      }
    }
  }
  return lists;
}

test("the docs' API lists match the generated .d.ts, both ways", () => {
  const dts = fromDts();
  assert.ok(dts.member.has("connect") && dts.event.has("closed") && dts.option.has("urls"), "the .d.ts parsed");
  assert.ok(DOCS.length >= 1);
  for (const file of DOCS) {
    const doc = fromDoc(file);
    for (const [kind, declared] of Object.entries(dts)) {
      const listed = new Set(doc[kind] ?? []);
      if (kind === "member") listed.delete("SwitchboardClient");   // the constructor row
      const missing = [...declared].filter((n) => !listed.has(n)).sort();
      const extra = [...listed].filter((n) => !declared.has(n)).sort();
      assert.deepEqual({ missing, extra }, { missing: [], extra: [] },
        `${file}: the "${kind}" table against the .d.ts (missing: not listed; extra: listed, not declared)`);
    }
  }
});
