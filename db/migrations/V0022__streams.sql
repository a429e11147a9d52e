-- V0022: streams -- an answer written chunk by chunk, read live and resumed by seq.
--
-- Until now every chunk of a streamed completion was one notify_user(): one
-- durable event row, one COMMIT, one NOTIFY -- about 2,500 chunks/s for the whole
-- cluster, and a stream had no identity to resume or stop. A stream is now a row
-- here plus a chunk log; a replica writes the chunks of all the streams produced
-- on it in one statement per few milliseconds (stream_append_many: group append,
-- one COMMIT and one wake-up for many chunks), and the final message alone is a
-- durable event (stream.end).
--
-- Storage: both tables are LOGGED. Measured (bench/streams.py --db, BENCHMARKS.md
-- "Issue 31"): with chunks grouped per statement the WAL and the flush are shared
-- by hundreds of chunks, and UNLOGGED bought little while losing every chunk of
-- every stream on a crash and on a Patroni failover (UNLOGGED tables are empty on
-- a promoted standby). Logged, a committed chunk survives both, like any row.
--
-- Function changes (applied by afterAll): 55_streams.sql (new): stream_open,
-- stream_append, stream_append_many, stream_renew, stream_close, stream_stop,
-- stream_read, stream_read_many, stream_info, streams_of, reap_streams;
-- maintenance(integer, ...) also reaps streams.

CREATE TABLE switchboard.streams (
    id          uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    user_id     uuid NOT NULL REFERENCES switchboard.users (id) ON DELETE CASCADE,
    room        text,
    kind        text NOT NULL,
    meta        jsonb NOT NULL DEFAULT '{}',
    status      text NOT NULL DEFAULT 'open',
    last_seq    integer NOT NULL DEFAULT 0,
    final       jsonb,
    end_event   bigint,
    lease       interval NOT NULL,
    lease_until timestamptz NOT NULL,
    opened_at   timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL,
    closed_at   timestamptz,
    retention   interval NOT NULL DEFAULT '5 minutes',
    CONSTRAINT streams_status_check CHECK (status IN ('open', 'done', 'error', 'stopped')),
    CONSTRAINT streams_closed_check CHECK ((status = 'open') = (closed_at IS NULL)),
    CONSTRAINT streams_last_seq_check CHECK (last_seq >= 0)
);
CREATE INDEX streams_open_by_user ON switchboard.streams (user_id) WHERE status = 'open';
CREATE INDEX streams_open_by_room ON switchboard.streams (room) WHERE status = 'open' AND room IS NOT NULL;
CREATE INDEX streams_open_lease ON switchboard.streams (lease_until) WHERE status = 'open';
CREATE INDEX streams_closed ON switchboard.streams (closed_at) WHERE closed_at IS NOT NULL;
REVOKE ALL ON TABLE switchboard.streams FROM PUBLIC;
GRANT SELECT ON TABLE switchboard.streams TO switchboard_app;
COMMENT ON TABLE switchboard.streams IS
    'Streams (V0022): an answer written chunk by chunk (stream_open / stream_append / stream_close). Chunks are in stream_chunks; rows and chunks go retention after the stream closed (reap_streams).';
COMMENT ON COLUMN switchboard.streams.id IS 'Opaque and unguessable (a random UUID, 122 random bits): knowing it is not enough to read it, the reader must also be allowed.';
COMMENT ON COLUMN switchboard.streams.user_id IS 'The owner: who may read and stop it (and admins).';
COMMENT ON COLUMN switchboard.streams.room IS 'Optional: members of this room may read it too; its stream.end event goes to the room.';
COMMENT ON COLUMN switchboard.streams.kind IS 'What it carries, for the application (e.g. completion, tool_call).';
COMMENT ON COLUMN switchboard.streams.meta IS 'Small application metadata (up to 8 KiB), shown by streams_of().';
COMMENT ON COLUMN switchboard.streams.status IS 'open, then done / error / stopped (stream_close, stream_stop, or error when the producer''s lease or the lifetime ran out).';
COMMENT ON COLUMN switchboard.streams.last_seq IS 'The seq of the last chunk (0: none yet). Chunks are 1..last_seq with no gap.';
COMMENT ON COLUMN switchboard.streams.final IS 'The final payload given to stream_close (or the error the reaper recorded).';
COMMENT ON COLUMN switchboard.streams.end_event IS 'The id of the durable stream.end event, once sent.';
COMMENT ON COLUMN switchboard.streams.lease IS 'How long the producer may stay silent: every append renews lease_until by it.';
COMMENT ON COLUMN switchboard.streams.lease_until IS 'An open stream whose producer has not appended or renewed by then ends as error (reap_streams).';
COMMENT ON COLUMN switchboard.streams.expires_at IS 'The end of the stream''s lifetime: appends are refused after it and it ends as error.';
COMMENT ON COLUMN switchboard.streams.opened_at IS 'When stream_open created it.';
COMMENT ON COLUMN switchboard.streams.closed_at IS 'When it left open (closed, stopped, or ended as error by the reaper); NULL while open.';
COMMENT ON COLUMN switchboard.streams.retention IS 'How long the chunks stay readable after the stream closed.';

-- No foreign key to streams: the check would cost an index probe and a row lock
-- per chunk on the hottest insert there is. A trigger on streams deletes a
-- stream's chunks with it instead (streams are deleted one by one, rarely).
CREATE TABLE switchboard.stream_chunks (
    stream_id uuid NOT NULL,
    seq       integer NOT NULL,
    data      text NOT NULL,
    PRIMARY KEY (stream_id, seq)
);
REVOKE ALL ON TABLE switchboard.stream_chunks FROM PUBLIC;
GRANT SELECT ON TABLE switchboard.stream_chunks TO switchboard_app;
COMMENT ON TABLE switchboard.stream_chunks IS
    'The chunk log of each stream: seq from 1, no gaps, each chunk text up to 64 KiB. Written by stream_append / stream_append_many only.';

COMMENT ON COLUMN switchboard.stream_chunks.stream_id IS 'The stream (switchboard.streams.id); deleted with it.';
COMMENT ON COLUMN switchboard.stream_chunks.seq IS 'The chunk''s number in its stream: 1, 2, 3 ... with no gap.';
COMMENT ON COLUMN switchboard.stream_chunks.data IS 'The chunk (text, up to 64 KiB): a few tokens, a JSON part, whatever the producer sent.';

CREATE OR REPLACE FUNCTION switchboard._stream_deleted() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM switchboard.stream_chunks c WHERE c.stream_id = OLD.id;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION switchboard._stream_deleted() FROM PUBLIC;
CREATE TRIGGER streams_delete_chunks AFTER DELETE ON switchboard.streams
    FOR EACH ROW EXECUTE FUNCTION switchboard._stream_deleted();
