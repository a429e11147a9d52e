-- V0024: a group append rewrites each stream row it touches as a HOT update, and
-- the relay's stream read is planned for the data it reads.
--
-- Measured (bench/streams.py --mode db, BENCHMARKS.md "Issue 31"): every append
-- sets streams.last_seq and lease_until, and lease_until was indexed
-- (streams_open_lease), so no append could be a HOT update: 0 of 52,700-179,300
-- were, each wrote a new row version plus three index entries (~410 bytes of WAL
-- per stream per append, more than the chunk), and the table gathered ~15,000
-- dead rows per 4 s. The reaper's index is now on expires_at (never updated by an
-- append), and the table leaves room on each page for the new versions.
--
-- Function changes (applied by afterAll): stream_read_many returns one row per
-- stream (its state and its chunks as one text[] from first_seq) instead of a
-- state row plus a row per chunk: the replica spent ~12 % of its CPU on per-row
-- objects (a UUID per chunk row). Unreleased until now, so dropped and re-created
-- rather than given a _v2. stream_read_many and stream_read are planned for each call (plan_cache_mode = force_custom_plan). They are PL/pgSQL,
-- so a long-lived session (the hub's reader) cached a generic plan; made while
-- stream_chunks was analyzed empty, it scanned the whole table per stream per read
-- (30 ms a call, p99 385 ms) until the next ANALYZE.
-- (IF EXISTS: on a fresh install the function files run after every migration.)
DROP FUNCTION IF EXISTS switchboard.stream_read_many(uuid[], integer[], integer);
-- _stream_end_event takes the stream's id now, not a streams row, and streams_of is
-- PL/pgSQL: the function files load at every migration target, also below V0022.
DROP FUNCTION IF EXISTS switchboard._stream_end_event(switchboard.streams);
DROP INDEX switchboard.streams_open_lease;
CREATE INDEX streams_open_expiry ON switchboard.streams (expires_at) WHERE status = 'open';
ALTER TABLE switchboard.streams SET (fillfactor = 50);
