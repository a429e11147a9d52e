// Streams (docs/how-to/streams.md): an answer streamed chunk by chunk over the client's socket,
// read as an async iterable that yields each chunk once and in order across reconnects.
//
// A stream's chunks have seqs 1, 2, 3, ... without gaps. The iterator keeps `last` (the last
// seq it yielded) and a bounded buffer of the chunks after it (seqs last+1 .. held), so every
// decision is a comparison of seqs:
//   a frame's chunks at or below `held`   -> already had: dropped
//   a frame starting after `held + 1`     -> a gap: unsubscribe, subscribe again after `held`
//   the buffer full (the consumer is slow) -> unsubscribe; subscribe after `held` once it drained to half
//   a new socket (every reconnect)        -> subscribe after `held`
//   stream.end and `last` >= its last_seq  -> iteration complete
import type { ErrorFrame, StreamEndFrame } from "./frames.js";
import type { components } from "./rest.js";
import { SwitchboardError } from "./errors.js";

export interface StreamChunk { seq: number; data: string }

/** How a stream ended (the stream.end frame's payload). */
export interface StreamResult {
  status: "done" | "error" | "stopped";
  last_seq: number;
  /** The producer's final payload (any JSON value; null when none). */
  final: unknown;
}

/** One of the user's open streams, as `GET /streams` lists it (generated from the OpenAPI document). */
export type StreamInfo = components["schemas"]["StreamInfo"];

export interface StreamOptions {
  /** Yield the chunks after this seq (default 0: all of them; or, with `resume`, the stored seq). */
  after?: number;
  /** Start after the last seq yielded for this id in this tab (kept in the client's `storage`,
   *  so a page reload resumes). Off by default: an app that rebuilds the whole text wants `after: 0`. */
  resume?: boolean;
  /** Aborting ends the iteration (it rejects with the signal's reason) and unsubscribes. */
  signal?: AbortSignal;
  /** At most this many chunks wait for the consumer (default 1000); beyond that the stream
   *  unsubscribes and subscribes again once the consumer has taken half of them. */
  bufferSize?: number;
}

/** A stream refused by the server (`stream_not_found`, `bad_stream`, `stream_limit`), or left
 *  before its end (`closed`, on `result` only). A SwitchboardError. */
export class StreamError extends SwitchboardError {
  readonly stream: string;
  constructor(code: string, message: string, stream: string) {
    super(code, message);
    this.name = "StreamError";
    this.stream = stream;
  }
}

/** @internal What a stream needs from its client. */
export interface StreamHost {
  /** Send a frame on the current socket; false when not connected. */
  send(frame: object): boolean;
  /** Send stream.unsubscribe (its answer is then expected and not mistaken for a drop). */
  unsubscribe(id: string): void;
  /** POST /streams/{id}/stop. */
  stopHttp(id: string): Promise<void>;
  /** Remember the last yielded seq (resume). */
  save(id: string, seq: number): void;
  /** The iteration is over: forget this stream. */
  release(s: SwitchboardStream): void;
}

type Waiter = { resolve: (r: IteratorResult<StreamChunk>) => void; reject: (e: unknown) => void };

export class SwitchboardStream implements AsyncIterableIterator<StreamChunk> {
  readonly id: string;
  /** How the stream ended: resolves on stream.end; rejects when the stream is refused, or left
   *  (break, return(), the signal) before its end. */
  readonly result: Promise<StreamResult>;
  private last: number;
  private buf: string[] = [];
  private readonly max: number;
  private end: StreamResult | undefined;
  private failure: unknown;
  private closed = false;
  private subscribed = false;         // a subscription on the current socket, as far as we know
  private paused = false;             // unsubscribed because the buffer is full
  private waiters: Waiter[] = [];
  private settle!: { ok: (r: StreamResult) => void; fail: (e: unknown) => void };
  private readonly onAbort: () => void;

  /** @internal use `client.stream(id)` */
  constructor(id: string, private readonly host: StreamHost, after: number,
    private readonly opts: StreamOptions) {
    this.id = id;
    this.last = after;
    this.max = Math.max(1, opts.bufferSize ?? 1000);
    this.result = new Promise<StreamResult>((ok, fail) => { this.settle = { ok, fail }; });
    this.result.catch(() => { /* observed by whoever awaits it; not an unhandled rejection */ });
    this.onAbort = () => this.fail(opts.signal?.reason ?? new StreamError("closed", "aborted", id));
  }

  /** @internal */
  start(): void {
    const sig = this.opts.signal;
    if (sig?.aborted) return this.onAbort();
    sig?.addEventListener("abort", this.onAbort, { once: true });
    this.subscribe();
  }

  /** The seq of the last chunk yielded (`after` before the first). */
  get lastSeq(): number { return this.last; }

  /** The last seq held: yielded, or buffered and not yet yielded. */
  private get held(): number { return this.last + this.buf.length; }

  [Symbol.asyncIterator](): this { return this; }

  next(): Promise<IteratorResult<StreamChunk>> {
    try {
      const r = this.take();
      if (r) return Promise.resolve(r);
    } catch (e) {
      return Promise.reject(e);
    }
    return new Promise((resolve, reject) => { this.waiters.push({ resolve, reject }); });
  }

  /** `break` out of a for-await loop lands here: unsubscribe and end the iteration. */
  return(): Promise<IteratorResult<StreamChunk>> {
    this.close(new StreamError("closed", "the stream was left before its end", this.id));
    return Promise.resolve({ value: undefined, done: true });
  }

  /** Ask the producer to stop: `stream.stop` on the socket, or `POST /streams/{id}/stop` when not
   *  connected. The iteration then ends with `result.status` "stopped". */
  async stop(): Promise<void> {
    if (!this.host.send({ action: "stream.stop", stream: this.id })) await this.host.stopHttp(this.id);
  }

  // ---- from the client -------------------------------------------------------------------------
  /** @internal A new socket (hello): subscriptions do not outlive a socket. */
  connected(): void {
    this.subscribed = false;
    this.subscribe();
  }

  /** @internal stream.chunks. `quiet`: an unsubscribe is in flight, so this frame may belong to
   *  the old subscription: keep what fits, but a gap is no reason to subscribe again. */
  chunks(seq: unknown, chunks: unknown, quiet: boolean): void {
    if (this.closed || !Number.isSafeInteger(seq) || !Array.isArray(chunks)) return;
    const held = this.held;
    if ((seq as number) > held + 1) {
      if (!quiet) this.resubscribe();   // chunks were lost: ask again from what we have
      return;
    }
    for (let i = held + 1 - (seq as number); i < chunks.length; i++) {
      if (this.buf.length >= this.max) {
        this.pause();
        break;
      }
      this.buf.push(String(chunks[i]));
    }
    this.wake();
  }

  /** @internal stream.end; `ofSubscription`: it ended this socket's subscription (not the stored
   *  event, nor a frame of a subscription already given up). */
  ended(p: StreamEndFrame["payload"], ofSubscription: boolean): void {
    if (this.closed || !Number.isSafeInteger(p?.last_seq)) return;
    if (!this.end) {
      this.end = { status: p.status, last_seq: p.last_seq, final: p.final ?? null };
      this.settle.ok(this.end);
    }
    if (ofSubscription) {
      this.subscribed = false;
      this.subscribe();          // only if chunks up to last_seq are still missing
    }
    this.wake();
  }

  /** @internal The server ended the subscription on its own (stream.unsubscribed nobody asked for). */
  dropped(): void {
    if (!this.subscribed) return;
    this.subscribed = false;
    this.subscribe();
  }

  /** @internal An error frame naming this stream. */
  refused(p: ErrorFrame["payload"]): void {
    if (p.action === "stream.stop" && p.code !== "stream_not_found") return;   // the stop failed, the stream goes on
    this.subscribed = false;
    this.fail(new StreamError(p.code, p.message, this.id));
  }

  // ---- internals ---------------------------------------------------------------------------------
  private subscribe(): void {
    if (this.closed || this.paused || this.subscribed) return;
    if (this.end && this.held >= this.end.last_seq) return;   // everything is here
    this.subscribed = this.host.send({ action: "stream.subscribe", stream: this.id, after: this.held });
  }

  private unsubscribe(): void {
    if (!this.subscribed) return;
    this.subscribed = false;
    this.host.unsubscribe(this.id);
  }

  private resubscribe(): void {
    this.unsubscribe();
    this.subscribe();
  }

  private pause(): void {
    this.paused = true;
    this.unsubscribe();
  }

  /** The next result if there is one now; null: wait. Throws the failure (once). */
  private take(): IteratorResult<StreamChunk> | null {
    if (this.failure !== undefined) {
      const e = this.failure;
      this.failure = undefined;
      throw e;
    }
    if (this.buf.length) {
      const data = this.buf.shift()!;
      const seq = ++this.last;
      if (this.opts.resume) this.host.save(this.id, seq);
      if (this.paused && this.buf.length <= this.max >> 1) {
        this.paused = false;
        this.subscribe();
      }
      return { value: { seq, data }, done: false };
    }
    if (this.closed) return { value: undefined, done: true };
    if (this.end && this.last >= this.end.last_seq) {
      this.close();
      return { value: undefined, done: true };
    }
    return null;
  }

  private wake(): void {
    // take() may close the stream, which wakes waiters itself: hence the `?.`.
    while (this.waiters.length) {
      let r: IteratorResult<StreamChunk> | null;
      try {
        r = this.take();
      } catch (e) {
        this.waiters.shift()?.reject(e);
        continue;
      }
      if (!r) return;
      this.waiters.shift()?.resolve(r);
    }
  }

  private fail(e: unknown): void {
    if (this.closed) return;
    this.failure = e;
    this.close(e);
  }

  /** End the iteration: unsubscribe, forget, settle `result` if stream.end never came. */
  private close(reason?: unknown): void {
    if (this.closed) return;
    this.closed = true;
    this.buf = [];
    this.unsubscribe();
    this.opts.signal?.removeEventListener("abort", this.onAbort);
    this.host.release(this);
    if (!this.end) this.settle.fail(reason ?? new StreamError("closed", "the stream was left before its end", this.id));
    this.wake();
  }
}
