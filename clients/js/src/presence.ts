// Pushed presence (the server's presence.state / presence.diff frames): the list of a room's online
// members kept from the frames, with onSync / onJoin / onLeave in the manner of Phoenix Presence.
import type { PresenceDiffFrame, PresenceMember, PresenceMeta, PresenceStateFrame } from "./frames.js";

/** A member came online (`previous` undefined) or their metadata changed (`previous`: the old entry). */
export type PresenceJoinFn = (member: PresenceMember, previous: PresenceMember | undefined) => void;
/** A member went offline (`member`: their last entry). */
export type PresenceLeaveFn = (member: PresenceMember) => void;
/** The list after a state or a diff was applied. */
export type PresenceSyncFn = (members: PresenceMember[]) => void;

const isMember = (e: unknown): e is PresenceMember =>
  !!e && typeof (e as PresenceMember).user_id === "string" && Array.isArray((e as PresenceMember).metas);
const members = (a: unknown): PresenceMember[] => (Array.isArray(a) ? a.filter(isMember) : []);
const same = (a: PresenceMember, b: PresenceMember): boolean => JSON.stringify(a) === JSON.stringify(b);

function call<A extends unknown[]>(fns: Set<(...a: A) => void>, ...args: A): void {
  for (const f of [...fns]) {
    try { f(...args); } catch (e) { queueMicrotask(() => { throw e; }); }   // as the client's own listeners
  }
}

/** @internal Add fn to a listener set; returns the function that removes it. */
export function listen<T>(set: Set<T>, fn: T): () => void {
  set.add(fn);
  return () => { set.delete(fn); };
}

/** One room's online members as the server pushes them. */
export class PresenceList {
  private readonly byId = new Map<string, PresenceMember>();
  readonly joins = new Set<PresenceJoinFn>();
  readonly leaves = new Set<PresenceLeaveFn>();
  readonly syncs = new Set<PresenceSyncFn>();
  /** A state arrived (since the room was joined). */
  synced = false;
  /** The server says the room has more online members than its list holds. */
  truncated = false;

  /** The online members, by username. */
  list(): PresenceMember[] {
    return [...this.byId.values()].sort((a, b) => (a.username < b.username ? -1 : a.username > b.username ? 1 : 0));
  }

  /** A presence.state: the whole list. What differs from the list kept so far (after a reconnect) is
   *  reported as joins and leaves. */
  state(p: PresenceStateFrame["payload"]): void {
    const next = new Map(members(p?.members).map((m) => [m.user_id, m]));
    this.truncated = p?.truncated === true;
    this.apply([...this.byId.values()].filter((m) => !next.has(m.user_id)), [...next.values()]);
  }

  /** A presence.diff: leaves, then joins (a join replaces the entry). */
  diff(p: PresenceDiffFrame["payload"]): void {
    if (this.synced) this.apply(members(p?.leaves), members(p?.joins));
  }

  private apply(gone: PresenceMember[], came: PresenceMember[]): void {
    this.synced = true;
    for (const m of gone) {
      const old = this.byId.get(m.user_id);
      if (old && this.byId.delete(m.user_id)) call(this.leaves, old);
    }
    for (const m of came) {
      const old = this.byId.get(m.user_id);
      if (old && same(old, m)) continue;
      this.byId.set(m.user_id, m);
      call(this.joins, m, old);
    }
    call(this.syncs, this.list());
  }

  /** The room was left: the list empties (each member leaves), and waits for the next state. */
  clear(): void {
    if (this.synced) this.apply([...this.byId.values()], []);
    this.synced = false;
  }
}

/** @internal The client's presence of every watched room: subscribes (or tracks) when a room is joined. */
export class PresenceHub {
  private readonly lists = new Map<string, PresenceList>();
  private readonly metas = new Map<string, PresenceMeta>();
  private readonly send: (frame: object) => boolean;
  private readonly joined: (room: string) => boolean;

  constructor(send: (frame: object) => boolean, joined: (room: string) => boolean) {
    this.send = send;
    this.joined = joined;
  }

  /** The room's list; watching it asks the server for its presence (now if joined, else once joined). */
  watch(room: string): PresenceList {
    let l = this.lists.get(room);
    if (!l) {
      this.lists.set(room, (l = new PresenceList()));
      if (this.joined(room)) this.ask(room);
    }
    return l;
  }

  /** Show this connection in the room with `meta` (kept and sent again after every reconnect). */
  track(room: string, meta: PresenceMeta): boolean {
    this.metas.set(room, meta);
    this.watch(room);
    return this.joined(room) && this.ask(room);
  }

  private ask(room: string): boolean {
    const meta = this.metas.get(room);
    return this.send(meta ? { action: "presence.track", room, meta } : { action: "presence.subscribe", room });
  }

  /** A room's state changed (the client's `room` event). */
  room(room: string, state: string): void {
    if (state === "joined") {
      if (this.lists.has(room)) this.ask(room);
    } else if (state !== "joining") {
      this.lists.get(room)?.clear();     // its members leave, for the listeners
      this.lists.delete(room);           // and the listeners go with the room
      this.metas.delete(room);
    }
  }

  /** A presence frame from the server. */
  frame(f: PresenceStateFrame | PresenceDiffFrame): void {
    const l = typeof f.room === "string" ? this.lists.get(f.room) : undefined;
    if (!l) return;
    if (f.event === "presence.state") l.state(f.payload);
    else l.diff(f.payload);
  }
}
