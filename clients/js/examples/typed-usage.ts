// Compiled by `npm run typecheck` (tsc --strict): the REST types generated from
// /openapi.json must let ordinary code compile, and wrong code fail.
import { HttpError, SwitchboardClient, type EventFrame, type paths } from "../src/index.js";

type CreateTask = paths["/tasks"]["post"]["requestBody"]["content"]["application/json"];

export async function example(client: SwitchboardClient): Promise<void> {
  const session = await client.login("alice", "secret");
  const role: "admin" | "member" = session.role;

  // A task whose handler takes SQL: args is free-form JSON, not Record<string, never>.
  const task: CreateTask = { name: "nightly-report", handler: "sql", schedule: "0 3 * * *",
    args: { sql: "SELECT count(*) FROM orders" } };
  const created = await client.api("post", "/tasks", { body: task });
  console.log(created);

  const me = await client.api("get", "/me");
  const userId: string = me.user_id;
  const who: string = me.username;

  const room = await client.api("get", "/rooms/{room}/members", { path: { room: "lobby" } });
  const online: boolean[] = room.members.map((m) => m.online);

  const ticket = await client.api("post", "/ws/ticket");
  const expires: number = ticket.expires_in;

  // @ts-expect-error a path parameter is required
  await client.api("get", "/rooms/{room}/members");
  // @ts-expect-error /me has no POST
  await client.api("post", "/me");

  client.on("event", (f: EventFrame) => {
    const id: number = f.id;
    console.log(id, f.event, f.payload, role, userId, who, online, expires);
  });
  try {
    await client.api("post", "/events", { body: { user_id: userId, event: "note", payload: { n: 1 } } });
  } catch (e) {
    if (e instanceof HttpError && e.status === 403) console.log(e.detail, e.type);
  }
}
