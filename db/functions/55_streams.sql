-- Streams (V0022): an answer written chunk by chunk, read live and resumed by seq.
--
-- A stream row (switchboard.streams) and its chunk log (stream_chunks: seq from 1,
-- no gaps). Producers append (stream_append, or stream_append_many for every
-- stream a replica produces, in one statement); every append that adds chunks
-- sends one NOTIFY on channel switchboard_stream whose payload lists the stream
-- ids (or '*' when they do not fit). That payload is a hint, like every NOTIFY
-- (any role that can connect may send one): a relay reads the chunk rows of the
-- streams it serves (stream_read_many) and delivers what it read, never what it
-- was told. stream_stop also NOTIFYs switchboard_stream_stop with the id, so
-- the producer, on whatever replica, re-reads the status and stops.
--
-- Errors: P0002 unknown stream (or one the reader may not see: the same answer),
-- 55000 the stream is not open (its status in the message), 54000 a bound
-- (chunk size, chunks per call, chunks per stream, open streams per user),
-- 22023 a bad argument, 22004 a NULL chunk.
--
-- What a crash loses: nothing committed (both tables are logged and replicated).
-- A producer that dies leaves its stream open until its lease runs out, then
-- reap_streams() ends it as error, so no stream stays open for ever.

-- The trigger (V0022) that deletes a stream's chunks with its row: stream_chunks
-- has no foreign key (a check per chunk on the hottest insert there is).
CREATE OR REPLACE FUNCTION switchboard._stream_deleted() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    DELETE FROM switchboard.stream_chunks c WHERE c.stream_id = OLD.id;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION switchboard._stream_deleted() FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard._stream_check_chunks(chunks text[], max_chunks integer)
RETURNS integer
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer := coalesce(cardinality(chunks), 0);
    v_big integer;
BEGIN
    IF chunks IS NULL THEN
        RAISE EXCEPTION 'chunks must not be NULL' USING ERRCODE = '22004',
            HINT = 'Pass an array of text chunks, e.g. ARRAY[''Hel'', ''lo''].';
    END IF;
    IF v_n > max_chunks THEN
        RAISE EXCEPTION '% chunks in one call, the limit is %', v_n, max_chunks USING ERRCODE = '54000',
            HINT = 'Append in several calls.';
    END IF;
    IF array_position(chunks, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'chunk % is NULL', array_position(chunks, NULL) USING ERRCODE = '22004',
            HINT = 'Every chunk is a text; send '''' for an empty one.';
    END IF;
    SELECT u.ord INTO v_big FROM unnest(chunks) WITH ORDINALITY AS u(c, ord)
     WHERE octet_length(u.c) > 65536 LIMIT 1;
    IF v_big IS NOT NULL THEN
        RAISE EXCEPTION 'chunk % is % bytes, the limit is 65536', v_big, octet_length(chunks[v_big])
            USING ERRCODE = '54000', HINT = 'Split it into several chunks.';
    END IF;
    RETURN v_n;
END
$$;
REVOKE ALL ON FUNCTION switchboard._stream_check_chunks(text[], integer) FROM PUBLIC;

-- Who may see a stream: a trusted caller (reader NULL: the application's own
-- code, a DBA), its owner, an admin, a member of its room.
CREATE OR REPLACE FUNCTION switchboard._stream_visible(s_user uuid, s_room text, reader uuid)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT reader IS NULL OR reader = s_user
        OR EXISTS (SELECT 1 FROM switchboard.users u WHERE u.id = reader AND u.role = 'admin' AND NOT u.disabled)
        OR (s_room IS NOT NULL AND EXISTS (
                SELECT 1 FROM switchboard.room_members m WHERE m.room = s_room AND m.user_id = reader))
$$;
REVOKE ALL ON FUNCTION switchboard._stream_visible(uuid, text, uuid) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard._stream_not_found(stream_id uuid)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RAISE EXCEPTION 'stream % does not exist', stream_id USING ERRCODE = 'P0002',
        HINT = 'Streams go retention (5 minutes by default) after they close; a stream you may not read is reported the same way.';
END
$$;
REVOKE ALL ON FUNCTION switchboard._stream_not_found(uuid) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard.stream_open(
    user_id uuid, kind text, meta jsonb DEFAULT '{}', room text DEFAULT NULL,
    lease interval DEFAULT '30 seconds', lifetime interval DEFAULT '1 hour')
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v_open integer;
    v_id uuid;
BEGIN
    IF kind IS NULL OR kind !~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,63}$' THEN
        RAISE EXCEPTION 'invalid stream kind "%"', kind USING ERRCODE = '22023',
            HINT = 'A kind is 1 to 64 characters: letters, digits, _ . : - (e.g. completion).';
    END IF;
    IF meta IS NULL OR jsonb_typeof(meta) <> 'object' OR octet_length(meta::text) > 8192
       OR jsonb_path_exists(meta, 'lax $.**{65}') THEN
        -- (depth: readers parse meta recursively, GET /streams included; as _check_event)
        RAISE EXCEPTION 'invalid stream meta (%)', coalesce(jsonb_typeof(meta), 'NULL') USING ERRCODE = '22023',
            HINT = 'meta is a JSON object of at most 8 KiB, nested at most 64 levels; put large data elsewhere.';
    END IF;
    IF room IS NOT NULL AND room !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$' THEN
        RAISE EXCEPTION 'invalid room name "%"', room USING ERRCODE = '22023',
            HINT = 'A room name is 1 to 128 characters: letters, digits, _ . : -';
    END IF;
    IF lease IS NULL OR lease < interval '1 second' OR lease > interval '1 hour' THEN
        RAISE EXCEPTION 'invalid lease %', lease USING ERRCODE = '22023',
            HINT = 'The producer''s lease is 1 second to 1 hour (default 30 seconds): it ends a stream whose producer died.';
    END IF;
    IF lifetime IS NULL OR lifetime < interval '1 second' OR lifetime > interval '1 day' THEN
        RAISE EXCEPTION 'invalid lifetime %', lifetime USING ERRCODE = '22023',
            HINT = 'A stream lives 1 second to 1 day (default 1 hour).';
    END IF;
    -- The user's row lock makes the open-stream bound exact under concurrent opens.
    PERFORM 1 FROM switchboard.users u WHERE u.id = user_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'user % does not exist', user_id USING ERRCODE = 'P0002';
    END IF;
    SELECT count(*) INTO v_open FROM (
        SELECT 1 FROM switchboard.streams s WHERE s.user_id = user_id AND s.status = 'open' LIMIT 100) o;
    IF v_open >= 100 THEN
        RAISE EXCEPTION 'user % has 100 open streams, the limit', user_id USING ERRCODE = '54000',
            HINT = 'Close streams when their answer is complete (stream_close); a producer that died releases its streams when its lease runs out.';
    END IF;
    INSERT INTO switchboard.streams AS s (user_id, room, kind, meta, lease, lease_until, expires_at)
    VALUES (user_id, room, kind, meta, lease, now() + lease, now() + lifetime)
    RETURNING s.id INTO v_id;
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION switchboard.stream_open(uuid, text, jsonb, text, interval, interval) IS
    'Open a stream owned by user_id (and readable by the members of room, if given); returns its id (a random UUID). The producer must append or renew within lease (1 s - 1 h, default 30 s) or the stream ends as error; it lives at most lifetime (default 1 hour). At most 100 open streams per user (54000). Errors: P0002 unknown user, 22023 bad kind / meta / room / lease / lifetime.';
REVOKE ALL ON FUNCTION switchboard.stream_open(uuid, text, jsonb, text, interval, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.stream_open(uuid, text, jsonb, text, interval, interval) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.stream_append(stream_id uuid, chunks text[])
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v record;             -- a streams row (not %ROWTYPE: the file must load below V0022)
    v_n integer;
BEGIN
    v_n := switchboard._stream_check_chunks(chunks, 10000);
    SELECT * INTO v FROM switchboard.streams s WHERE s.id = stream_id FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM switchboard._stream_not_found(stream_id);
    END IF;
    IF v.status <> 'open' THEN
        RAISE EXCEPTION 'stream % is %: it takes no more chunks', stream_id, v.status USING ERRCODE = '55000',
            HINT = CASE v.status WHEN 'stopped'
                THEN 'Someone stopped it (stream_stop): stop producing and close it with stream_close(id, ''stopped'', final).'
                ELSE 'A closed stream is final; open a new one.' END;
    END IF;
    IF v.expires_at <= now() THEN
        RAISE EXCEPTION 'stream % outlived its lifetime (expired at %)', stream_id, v.expires_at
            USING ERRCODE = '55000', HINT = 'Open streams with a longer lifetime (stream_open(..., lifetime => ...)).';
    END IF;
    IF v.last_seq + v_n > 1000000 THEN
        RAISE EXCEPTION 'stream % would hold % chunks, the limit is 1000000', stream_id, v.last_seq + v_n
            USING ERRCODE = '54000', HINT = 'Send larger chunks, or continue in a new stream.';
    END IF;
    IF v_n > 0 THEN
        INSERT INTO switchboard.stream_chunks (stream_id, seq, data)
        SELECT stream_id, v.last_seq + u.ord::integer, u.c FROM unnest(chunks) WITH ORDINALITY AS u(c, ord);
        PERFORM pg_notify('switchboard_stream', stream_id::text);
    END IF;
    UPDATE switchboard.streams s SET last_seq = v.last_seq + v_n, lease_until = now() + s.lease
     WHERE s.id = stream_id;
    RETURN v.last_seq + v_n;
END
$$;
COMMENT ON FUNCTION switchboard.stream_append(uuid, text[]) IS
    'Append chunks (in order, each text up to 64 KiB, at most 10000 per call) to an open stream; returns the seq of the last one (chunks are numbered from 1 with no gap) and renews the producer''s lease (an empty array only renews). Readers are woken when the transaction commits. Errors: P0002 unknown stream, 55000 the stream is not open (stopped, done, error) or outlived its lifetime, 54000 a bound (chunk size, chunks per call, 1000000 chunks per stream), 22004 a NULL chunk.';
REVOKE ALL ON FUNCTION switchboard.stream_append(uuid, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.stream_append(uuid, text[]) TO switchboard_app;

-- The group append: one statement for every chunk a replica's producers sent in
-- the last few milliseconds, whatever stream it belongs to. A stream that is no
-- longer open (stopped from another replica, expired) is not an error here --
-- one stopped stream must not fail the chunks of the others -- it is reported
-- in its row (status, accepted 0) and the caller raises for that stream alone.
-- Rows are locked in id order, so two group appends never deadlock.
CREATE OR REPLACE FUNCTION switchboard.stream_append_many(stream_ids uuid[], chunks text[])
RETURNS TABLE (stream_id uuid, last_seq integer, status text, accepted integer)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ids uuid[];
    v_last integer[];
    v_status text[];
    v_acc integer[];
    v_hint text;
BEGIN
    PERFORM switchboard._stream_check_chunks(chunks, 10000);
    IF stream_ids IS NULL OR cardinality(stream_ids) <> cardinality(chunks)
       OR array_position(stream_ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'stream_ids has % elements for % chunks', cardinality(stream_ids), cardinality(chunks)
            USING ERRCODE = '22023', HINT = 'stream_ids[i] is the (non-NULL) stream of chunks[i]: the arrays have the same length.';
    END IF;
    WITH input AS (
        SELECT u.sid, u.data, u.ord FROM unnest(stream_ids, chunks) WITH ORDINALITY AS u(sid, data, ord)
    ), wanted AS (
        SELECT i.sid, count(*)::integer AS n FROM input i GROUP BY i.sid
    ), locked AS (
        SELECT s.id, s.last_seq, s.status, s.expires_at FROM switchboard.streams s
         WHERE s.id IN (SELECT w.sid FROM wanted w) ORDER BY s.id FOR UPDATE
    ), ok AS (
        SELECT l.id, l.last_seq FROM locked l JOIN wanted w ON w.sid = l.id
         WHERE l.status = 'open' AND l.expires_at > now() AND l.last_seq + w.n <= 1000000
    ), ins AS (
        INSERT INTO switchboard.stream_chunks (stream_id, seq, data)
        SELECT i.sid, ok.last_seq + (row_number() OVER (PARTITION BY i.sid ORDER BY i.ord))::integer, i.data
          FROM input i JOIN ok ON ok.id = i.sid
        RETURNING stream_chunks.stream_id, stream_chunks.seq
    ), counts AS (
        SELECT c.stream_id, max(c.seq) AS top, count(*)::integer AS n FROM ins c GROUP BY c.stream_id
    ), upd AS (
        UPDATE switchboard.streams s SET last_seq = c.top, lease_until = now() + s.lease
          FROM counts c WHERE s.id = c.stream_id
        RETURNING s.id, s.last_seq
    )
    SELECT array_agg(w.sid ORDER BY w.sid),
           array_agg(coalesce(u.last_seq, l.last_seq, 0) ORDER BY w.sid),
           array_agg(CASE WHEN l.id IS NULL THEN 'unknown'
                          WHEN l.status = 'open' AND l.expires_at <= now() THEN 'expired'
                          WHEN l.status = 'open' AND c.n IS NULL THEN 'full'
                          ELSE l.status END ORDER BY w.sid),
           array_agg(coalesce(c.n, 0) ORDER BY w.sid)
      INTO v_ids, v_last, v_status, v_acc
      FROM wanted w LEFT JOIN locked l ON l.id = w.sid LEFT JOIN upd u ON u.id = w.sid
      LEFT JOIN counts c ON c.stream_id = w.sid;
    SELECT string_agg(x.id::text, ',') INTO v_hint
      FROM unnest(v_ids, v_acc) AS x(id, n) WHERE x.n > 0;
    IF v_hint IS NOT NULL THEN
        PERFORM pg_notify('switchboard_stream', CASE WHEN length(v_hint) > 7900 THEN '*' ELSE v_hint END);
    END IF;
    RETURN QUERY SELECT * FROM unnest(v_ids, v_last, v_status, v_acc);
END
$$;
COMMENT ON FUNCTION switchboard.stream_append_many(uuid[], text[]) IS
    'The group append: chunks[i] goes to stream stream_ids[i], in array order within each stream; one statement, one COMMIT and one wake-up for all of them. Returns one row per stream: its last seq, its status (open; or stopped / done / error / expired / full / unknown, whose chunks were NOT appended: raise for that stream) and how many chunks it took. Chunks up to 64 KiB, at most 10000 per call (54000). Errors: 22023 arrays of different lengths or a NULL id, 22004 a NULL chunk.';
REVOKE ALL ON FUNCTION switchboard.stream_append_many(uuid[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.stream_append_many(uuid[], text[]) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.stream_renew(stream_ids uuid[])
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer;
BEGIN
    IF stream_ids IS NULL OR cardinality(stream_ids) > 10000 THEN
        RAISE EXCEPTION 'stream_ids must be an array of at most 10000 ids' USING ERRCODE = '22023';
    END IF;
    UPDATE switchboard.streams s SET lease_until = now() + s.lease
     WHERE s.id = ANY (stream_ids) AND s.status = 'open' AND s.expires_at > now();
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.stream_renew(uuid[]) IS
    'Renew the producer''s lease of open streams that had nothing to append lately (a model still thinking). Returns how many were open and renewed; the others are closed or expired.';
REVOKE ALL ON FUNCTION switchboard.stream_renew(uuid[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.stream_renew(uuid[]) TO switchboard_app;

-- The end: the stream.end event, durable, to the owner (or the room), once. Takes the
-- id, not a streams row: the function files load at every migration target, also
-- below V0022, where the row type does not exist yet.
CREATE OR REPLACE FUNCTION switchboard._stream_end_event(stream_id uuid)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v record;
    v_payload jsonb;
    v_event bigint;
BEGIN
    SELECT s.id, s.user_id, s.room, s.kind, s.status, s.last_seq, s.final INTO v
      FROM switchboard.streams s WHERE s.id = _stream_end_event.stream_id;
    v_payload := jsonb_build_object('stream', v.id, 'kind', v.kind, 'status', v.status,
                                    'last_seq', v.last_seq, 'final', v.final);
    IF v.room IS NOT NULL THEN
        v_event := switchboard.notify_room(v.room, 'stream.end', v_payload);
    ELSE
        v_event := switchboard.notify_user(v.user_id, 'stream.end', v_payload);
    END IF;
    UPDATE switchboard.streams s SET end_event = v_event WHERE s.id = v.id;
    PERFORM pg_notify('switchboard_stream', v.id::text);
    RETURN v_event;
END
$$;
REVOKE ALL ON FUNCTION switchboard._stream_end_event(uuid) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard.stream_close(stream_id uuid, status text DEFAULT 'done', final jsonb DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v record;             -- a streams row (not %ROWTYPE: the file must load below V0022)
BEGIN
    IF status IS NULL OR status NOT IN ('done', 'error', 'stopped') THEN
        RAISE EXCEPTION 'invalid stream status "%"', status USING ERRCODE = '22023',
            HINT = 'A stream closes as done, error or stopped.';
    END IF;
    IF final IS NOT NULL THEN
        PERFORM switchboard._check_event('stream.end', final, 1000000);
    END IF;
    SELECT * INTO v FROM switchboard.streams s WHERE s.id = stream_id FOR UPDATE;
    IF NOT FOUND THEN
        PERFORM switchboard._stream_not_found(stream_id);
    END IF;
    IF v.status = 'open' THEN
        UPDATE switchboard.streams s SET status = stream_close.status, final = stream_close.final, closed_at = now()
         WHERE s.id = stream_id RETURNING * INTO v;
    ELSIF v.status = 'stopped' AND v.end_event IS NULL THEN
        -- stopped by stream_stop: the producer closes it with its final (its partial answer)
        UPDATE switchboard.streams s SET final = stream_close.final WHERE s.id = stream_id RETURNING * INTO v;
    ELSE
        RAISE EXCEPTION 'stream % is already closed (%)', stream_id, v.status USING ERRCODE = '55000',
            HINT = 'A stream closes once.';
    END IF;
    RETURN switchboard._stream_end_event(v.id);
END
$$;
COMMENT ON FUNCTION switchboard.stream_close(uuid, text, jsonb) IS
    'End an open stream as done, error or stopped with a final payload (JSON, up to ~1 MB), or give a stream stopped by stream_stop its final payload. Sends the one durable event of the answer, stream.end {stream, kind, status, last_seq, final}, to the owner (or the room) iff the transaction commits, and returns its id. Errors: P0002 unknown stream, 55000 already closed, 22023 bad status or final.';
REVOKE ALL ON FUNCTION switchboard.stream_close(uuid, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.stream_close(uuid, text, jsonb) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.stream_stop(stream_id uuid, by_user uuid DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_variable
DECLARE
    v record;             -- a streams row (not %ROWTYPE: the file must load below V0022)
BEGIN
    SELECT * INTO v FROM switchboard.streams s WHERE s.id = stream_id FOR UPDATE;
    IF NOT FOUND OR NOT (by_user IS NULL OR by_user = v.user_id OR EXISTS (
            SELECT 1 FROM switchboard.users u WHERE u.id = by_user AND u.role = 'admin' AND NOT u.disabled)) THEN
        PERFORM switchboard._stream_not_found(stream_id);
    END IF;
    IF v.status = 'open' THEN
        UPDATE switchboard.streams s SET status = 'stopped', closed_at = now() WHERE s.id = stream_id;
        PERFORM pg_notify('switchboard_stream_stop', stream_id::text);
        PERFORM pg_notify('switchboard_stream', stream_id::text);
        RETURN 'stopped';
    END IF;
    RETURN v.status;
END
$$;
COMMENT ON FUNCTION switchboard.stream_stop(uuid, uuid) IS
    'Stop a stream from anywhere: an open stream becomes stopped at once (it takes no chunk after; its producer, on any replica, is told and closes it with its final payload) and its readers get the end. Idempotent: returns the status after (stopped, or the status it already had). by_user: only the owner or an admin may stop (NULL: a trusted caller). Errors: P0002 unknown stream or not by_user''s.';
REVOKE ALL ON FUNCTION switchboard.stream_stop(uuid, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.stream_stop(uuid, uuid) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.stream_info(stream_id uuid, reader uuid DEFAULT NULL)
RETURNS TABLE (id uuid, user_id uuid, room text, kind text, meta jsonb, status text, last_seq integer,
               final jsonb, opened_at timestamptz, closed_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    RETURN QUERY
    SELECT s.id, s.user_id, s.room, s.kind, s.meta, s.status, s.last_seq, s.final, s.opened_at, s.closed_at
      FROM switchboard.streams s
     WHERE s.id = stream_info.stream_id AND switchboard._stream_visible(s.user_id, s.room, stream_info.reader);
    IF NOT FOUND THEN
        PERFORM switchboard._stream_not_found(stream_info.stream_id);
    END IF;
END
$$;
COMMENT ON FUNCTION switchboard.stream_info(uuid, uuid) IS
    'One stream''s state. reader: answer only if that user may read it (owner, admin, room member; NULL: a trusted caller). Errors: P0002 unknown stream or not readable by reader.';
REVOKE ALL ON FUNCTION switchboard.stream_info(uuid, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.stream_info(uuid, uuid) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.stream_read(
    stream_id uuid, after_seq integer DEFAULT 0, max_rows integer DEFAULT 1000, reader uuid DEFAULT NULL)
RETURNS TABLE (seq integer, data text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
BEGIN
    IF after_seq IS NULL OR after_seq < 0 THEN
        RAISE EXCEPTION 'invalid after_seq %', after_seq USING ERRCODE = '22023',
            HINT = 'after_seq is the last seq the reader has (0 for the whole stream).';
    END IF;
    IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'invalid max_rows %', max_rows USING ERRCODE = '22023', HINT = 'max_rows is 1 to 100000.';
    END IF;
    PERFORM 1 FROM switchboard.streams s
     WHERE s.id = stream_read.stream_id AND switchboard._stream_visible(s.user_id, s.room, stream_read.reader);
    IF NOT FOUND THEN
        PERFORM switchboard._stream_not_found(stream_read.stream_id);
    END IF;
    RETURN QUERY
    SELECT c.seq, c.data FROM switchboard.stream_chunks c
     WHERE c.stream_id = stream_read.stream_id AND c.seq > stream_read.after_seq
     ORDER BY c.seq LIMIT stream_read.max_rows;
END
$$;
COMMENT ON FUNCTION switchboard.stream_read(uuid, integer, integer, uuid) IS
    'The chunks of a stream after after_seq, in seq order, at most max_rows (1-100000). Read until fewer than max_rows come back; stream_info() says whether more can come. reader as in stream_info(). Errors: P0002 unknown stream or not readable, 22023 bad after_seq / max_rows.';
REVOKE ALL ON FUNCTION switchboard.stream_read(uuid, integer, integer, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.stream_read(uuid, integer, integer, uuid) TO switchboard_app;

-- The relay's read: for each stream one row, its state and its chunks after the
-- given seq as one array, in one statement (one snapshot: the state and the chunks
-- agree). One row per stream, not per chunk (V0024): the replica turned a sizeable
-- share of its CPU into per-row objects (a UUID per chunk row) under load
-- (BENCHMARKS.md "Issue 31: streams", product problems found).
-- Planned for each call (V0024): the hub's reader session is long-lived, and a
-- generic plan cached while stream_chunks was analyzed empty scanned the whole
-- table per stream.
CREATE OR REPLACE FUNCTION switchboard.stream_read_many(stream_ids uuid[], after_seqs integer[], max_rows integer DEFAULT 1000)
RETURNS TABLE (stream_id uuid, status text, last_seq integer, final jsonb, end_event bigint, first_seq integer,
               chunks text[])
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
BEGIN
    IF stream_ids IS NULL OR after_seqs IS NULL OR cardinality(stream_ids) <> cardinality(after_seqs)
       OR cardinality(stream_ids) > 10000 THEN
        RAISE EXCEPTION 'stream_ids and after_seqs must be arrays of the same length (at most 10000)'
            USING ERRCODE = '22023';
    END IF;
    IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'invalid max_rows %', max_rows USING ERRCODE = '22023', HINT = 'max_rows is 1 to 100000.';
    END IF;
    RETURN QUERY
    SELECT s.id, s.status, s.last_seq, s.final, s.end_event, u.after_seq + 1,
           coalesce((SELECT array_agg(k.data ORDER BY k.seq) FROM (
                        SELECT c.seq, c.data FROM switchboard.stream_chunks c
                         WHERE c.stream_id = u.id AND c.seq > u.after_seq
                         ORDER BY c.seq LIMIT max_rows) k), '{}')
      FROM unnest(stream_ids, after_seqs) AS u(id, after_seq)
      JOIN switchboard.streams s ON s.id = u.id;
END
$$;
COMMENT ON FUNCTION switchboard.stream_read_many(uuid[], integer[], integer) IS
    'The relay''s read (no reader check: the relay checked the reader when it subscribed). One row per stream that exists: its status, last_seq, final and end_event (the durable stream.end event, NULL until sent: a reader''s end waits for it, so a stopped stream ends with its producer''s final), and its chunks after after_seqs[i] (at most max_rows) as one array whose first element has seq first_seq (= after_seqs[i] + 1; chunks have no gaps), all in one snapshot. A stream that no longer exists has no row.';
REVOKE ALL ON FUNCTION switchboard.stream_read_many(uuid[], integer[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.stream_read_many(uuid[], integer[], integer) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.streams_of(user_id uuid)
RETURNS TABLE (id uuid, room text, kind text, meta jsonb, status text, last_seq integer, opened_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- PL/pgSQL, not SQL: an SQL body is checked when the file loads, and the function
    -- files load at every migration target, also below V0022 (no streams table yet).
    RETURN QUERY
    SELECT s.id, s.room, s.kind, s.meta, s.status, s.last_seq, s.opened_at
      FROM switchboard.streams s
     WHERE s.status = 'open'
       AND (s.user_id = streams_of.user_id
            OR (s.room IS NOT NULL AND s.room IN (
                    SELECT m.room FROM switchboard.room_members m WHERE m.user_id = streams_of.user_id)))
     ORDER BY s.opened_at, s.id
     LIMIT 1000;
END
$$;
COMMENT ON FUNCTION switchboard.streams_of(uuid) IS
    'The open streams a user may read (theirs and their rooms'', at most 1000, oldest first): what a client that comes back (a page reload) resumes.';
REVOKE ALL ON FUNCTION switchboard.streams_of(uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.streams_of(uuid) TO switchboard_app;

-- The reaper, bounded: ends streams whose producer's lease or lifetime ran out
-- (error, with the durable stream.end), sends the end of stopped streams whose
-- producer never closed them, and deletes the chunks and rows of streams closed
-- longer ago than their retention, at most max_rows of each per call.
CREATE OR REPLACE FUNCTION switchboard.reap_streams(max_rows integer DEFAULT 10000)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v record;             -- a streams row (not %ROWTYPE: the file must load below V0022)
    v_chunks integer;
    v_rows integer;
BEGIN
    IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'invalid max_rows %', max_rows USING ERRCODE = '22023', HINT = 'max_rows is 1 to 1000000.';
    END IF;
    FOR v IN
        UPDATE switchboard.streams s
           SET status = 'error', closed_at = now(),
               final = jsonb_build_object('error', CASE WHEN s.expires_at <= now()
                   THEN 'the stream outlived its lifetime' ELSE 'the producer stopped renewing its lease' END)
         WHERE s.id IN (SELECT o.id FROM switchboard.streams o
                         WHERE o.status = 'open' AND (o.lease_until < now() OR o.expires_at <= now())
                         LIMIT max_rows FOR UPDATE SKIP LOCKED)
        RETURNING s.*
    LOOP
        PERFORM switchboard._stream_end_event(v.id);
    END LOOP;
    FOR v IN
        SELECT * FROM switchboard.streams s
         WHERE s.status = 'stopped' AND s.end_event IS NULL AND s.closed_at < now() - s.lease
         ORDER BY s.closed_at LIMIT max_rows FOR UPDATE SKIP LOCKED
    LOOP
        PERFORM switchboard._stream_end_event(v.id);
    END LOOP;
    DELETE FROM switchboard.stream_chunks c
     WHERE (c.stream_id, c.seq) IN (
        SELECT k.stream_id, k.seq FROM switchboard.streams s
          JOIN switchboard.stream_chunks k ON k.stream_id = s.id
         WHERE s.closed_at < now() - s.retention
         LIMIT max_rows);
    GET DIAGNOSTICS v_chunks = ROW_COUNT;
    DELETE FROM switchboard.streams s
     WHERE s.id IN (SELECT o.id FROM switchboard.streams o
                     WHERE o.closed_at < now() - o.retention
                       AND NOT EXISTS (SELECT 1 FROM switchboard.stream_chunks k WHERE k.stream_id = o.id)
                     ORDER BY o.closed_at LIMIT max_rows);
    GET DIAGNOSTICS v_rows = ROW_COUNT;
    RETURN v_chunks + v_rows;
END
$$;
COMMENT ON FUNCTION switchboard.reap_streams(integer) IS
    'Bounded stream reaper (run by maintenance()): ends as error every open stream whose producer''s lease or lifetime ran out (sending its stream.end), sends the end of stopped streams their producer did not close, and deletes up to max_rows chunks and max_rows rows of streams closed longer ago than their retention. Returns how many chunks and rows it deleted: call again while that equals max_rows or more.';
REVOKE ALL ON FUNCTION switchboard.reap_streams(integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_streams(integer) TO switchboard_app;
