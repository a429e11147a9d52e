// Shared by the runner and the roles of the resumable-stream peer.
import { createClient } from "redis";

// One clock for every process on the box: wall-clock origin of this process
// plus its monotonic offset, in milliseconds (float).
export const now = () => performance.timeOrigin + performance.now();

export const log = (...a) => process.stderr.write(`[${process.env.PEER_ROLE || "runner"} ${process.pid}] ${a.join(" ")}\n`);

export async function redisClient(url, name) {
  const c = createClient({ url, name, socket: { reconnectStrategy: false, connectTimeout: 5000 } });
  c.on("error", (e) => { log(`redis client ${name} error: ${e && e.message}`); process.exit(3); });
  await c.connect();
  return c;
}

// A chunk is "<seq>:<send_ms>:<filler>\n". The newline makes chunks self-delimiting,
// which resumable-stream needs: a resume delivers the missed chunks as ONE string.
export function makeChunk(seq, ts, filler) {
  return `${seq}:${ts.toFixed(3)}:${filler}\n`;
}

export function cpuSeconds(base) {
  const u = process.cpuUsage(base);
  return (u.user + u.system) / 1e6;
}

// Roles exit as soon as the runner goes away (IPC channel closed).
// and on the runner's "exit" command, whatever they are doing.
export function dieWithParent() {
  process.on("disconnect", () => process.exit(2));
  process.on("message", (m) => { if (m && m.cmd === "exit") process.exit(0); });
}
