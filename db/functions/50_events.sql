-- Events: targeted, transactional notify.
--
-- The event lives in switchboard.events (payloads up to 1 MiB). At COMMIT a
-- NOTIFY on channel switchboard_events wakes every replica's relay; it
-- carries only the id ({"id": N}) and is dropped on ROLLBACK. NOTIFY has no
-- permissions (any role that can connect may pg_notify anything, and LISTEN
-- to anything), so the payload is a hint: the relay reads what the ticks say
-- it has not read yet (relay_read_v3) and delivers what it read, never what it
-- was told (docs/security.md). The body never travels on the bus either, so a
-- LISTENing stranger learns ids, not contents.
--
-- Order without a lock (V0009, PgQ's design). Publishers take no lock: an id
-- comes from the sequence at insert time, so ids do NOT follow commit order.
-- Each row records the inserting transaction (events.xid, xid8). A tick
-- (event_tick, run by whichever relay gets the ticker row first) records a
-- snapshot; batch k = the events whose transaction is visible in tick k's
-- snapshot and not in tick k-1's. Every snapshot sees a transaction either
-- not at all or as committed, and tick k's snapshot contains tick k-1's, so
-- every committed event lands in exactly one batch, whatever order the
-- transactions commit in. The delivery order is (batch, id); a position in it
-- is (tick, id) -- the resume cursor. A transaction held open holds back
-- nothing but its own events: later ticks include everything else.
--
-- The former design (publishers serialised on switchboard.event_order until
-- COMMIT, _lock_event_order) was unused since V0009 and is dropped by V0014.

-- What an event must be, as one expression (V0023): true iff _check_event accepts it.
-- A caller's "IF switchboard._event_ok(...) IS NOT TRUE" inlines it (LANGUAGE sql, no
-- SET clause, not SECURITY DEFINER: a function with either is never inlined), so the
-- good path costs no function call and no executor run; _check_event, which says what
-- is wrong, runs only when it is false. Only called, and so inlined, inside functions
-- that pin search_path.
--
-- The label rule is "1 to 128 characters, the first not . : -". Written as
-- '^[...][...]{0,127}$' (before V0023) it was a measurable part of a publish:
-- PostgreSQL's regex engine expands a bounded repeat into 127 copies of the state
-- and builds the DFA afresh on every match. length() <= 128 plus '*' is the same
-- rule at a fraction of the cost (BENCHMARKS.md "Issue 31: the single event's
-- CPU"; the classes are ASCII, so characters are bytes; '$' is the end of the
-- string).
CREATE OR REPLACE FUNCTION switchboard._event_ok(event text, payload jsonb, max_bytes integer)
RETURNS boolean
LANGUAGE sql IMMUTABLE
AS $$
    SELECT event IS NOT NULL AND length(event) <= 128 AND event ~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]*$'
       AND payload IS NOT NULL AND octet_length(payload::text) <= max_bytes
       AND NOT jsonb_path_exists(payload, 'lax $.**{65}')
$$;
REVOKE ALL ON FUNCTION switchboard._event_ok(text, jsonb, integer) FROM PUBLIC;

-- The same rules one by one, raising the first that fails (SQLSTATE 22023 and a HINT).
-- Keep it and _event_ok in step (db/tests/30_events.sql compares them).
CREATE OR REPLACE FUNCTION switchboard._check_event(event text, payload jsonb, max_bytes integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_size integer;
BEGIN
    IF event IS NULL OR length(event) > 128 OR event !~ '^[A-Za-z0-9_][A-Za-z0-9_.:-]*$' THEN
        RAISE EXCEPTION 'invalid event label "%"', event USING ERRCODE = '22023',
            HINT = 'An event label is 1 to 128 characters: letters, digits, _ . : -';
    END IF;
    IF payload IS NULL THEN
        RAISE EXCEPTION 'event payload must not be NULL' USING ERRCODE = '22023', HINT = 'Use ''{}''::jsonb.';
    END IF;
    v_size := octet_length(payload::text);
    IF v_size > max_bytes THEN
        RAISE EXCEPTION 'event payload is % bytes, the limit is %', v_size, max_bytes
            USING ERRCODE = '22023', HINT = 'Store large data elsewhere and send a reference.';
    END IF;
    -- Depth (V0020): a payload nested thousands of levels deep is valid jsonb, but every
    -- reader parses it recursively (Python's json stops near 1,000 levels). A relay that
    -- could not parse one event reconnected and read it again, forever: one such event
    -- stopped all delivery on the replicas its user was connected to. Refused at the
    -- door instead, at the HTTP API's bound (bounded.DEFAULT_MAX_DEPTH: 64 nested
    -- containers). lax $.**{65}: some value sits inside 65 containers (C, one pass).
    IF jsonb_path_exists(payload, 'lax $.**{65}') THEN
        RAISE EXCEPTION 'event payload is nested more than 64 levels deep' USING ERRCODE = '22023',
            HINT = 'At most 64 nested arrays/objects: flatten the payload or send a reference.';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_event(text, jsonb, integer) FROM PUBLIC;

-- The verified live path (V0020, off by default; event_live_path()): besides the
-- hint, each event goes out whole on the key's channel (event_live.channel, V0025:
-- switchboard_live_<32 hex digits>, secret like the key), signed, so a relay can
-- deliver it without reading it first:
--   <HMAC-SHA256 of the rest, 64 hex digits>{"id":N,"u":"<user>"|null,"r":"<room>"|null,"e":"<event>","t":<ms>,"p":<payload>}
-- An event whose message exceeds event_live.max_bytes sends {"b":N} instead
-- ("an event you must read before any later live one"). Relays check the MAC
-- and read every event all the same (relay.py); the message is never the only
-- copy. The MAC is HMAC (RFC 2104) built from sha256(): pgcrypto is not needed.
--
-- What a publish costs (V0023, BENCHMARKS.md "Issue 31"). Most of notify_user's server
-- CPU was not the row: it was a function call with a SET clause per helper (a GUC
-- save/restore and a search path recomputed, three times a publish), one executor
-- run per statement (six: the checks, the user, the row, each switch, the NOTIFY, the
-- marker) and a bounded-repeat regex. Here the user check, the row and both switches
-- are one INSERT; the checks are an inlined expression (_event_ok); the NOTIFY and its
-- marker are plain assignments (no executor run); no SET clause: _publish runs only inside notify_user and
-- notify_room, which pin search_path (its plans are cached under that path).
--
-- user_id non-NULL: the user must exist (P0002, as notify_user always said); the row
-- is inserted only if it does (INSERT ... SELECT ... WHERE EXISTS), so a missing user
-- costs no id.
CREATE OR REPLACE FUNCTION switchboard._publish(user_id uuid, room text, event text, payload jsonb)
RETURNS bigint
LANGUAGE plpgsql
AS $$
DECLARE
    v_id bigint;
    v_now timestamptz := clock_timestamp();
    v_notify boolean;
    -- Plain variables, not event_live%ROWTYPE: a declared row type is resolved when the
    -- function is created, and function files are also applied to older schemas
    -- (pgmigrate's afterAll after a partial migration, as tests/test_hostile_input.py does).
    v_max integer;
    v_ipad bytea;
    v_opad bytea;
    v_channel text;
    v_msg text;
    v_hints boolean;
    v_live boolean;
    v_mark text;
BEGIN
    -- No lock: order comes from ticks (events.xid defaults to this transaction's id).
    -- The RETURNING subqueries read the two switches in the INSERT's own executor run:
    -- publishers_notify, and id_hints of the live path (NULL while it is off: the
    -- column is NOT NULL, so NULL means "no enabled row").
    -- The transaction's id first, then the event's (V0038): a relay read bounds the
    -- ids it visits by the sequence position before a tick's snapshot
    -- (event_ticks.id_floor), which holds only if every event's xid was assigned
    -- before its id was taken. In this INSERT alone nextval would run first (the xid
    -- column's default is evaluated after the SELECT), and routing to a partition
    -- can wait for a lock in between.
    PERFORM pg_current_xact_id();
    INSERT INTO switchboard.events AS e (id, user_id, room, event, payload, created_at)
    SELECT nextval('switchboard.event_id_seq'), _publish.user_id, _publish.room, _publish.event,
           _publish.payload, v_now
     WHERE _publish.user_id IS NULL
        OR EXISTS (SELECT 1 FROM switchboard.users u WHERE u.id = _publish.user_id)
    RETURNING e.id,
              (SELECT t.publishers_notify FROM switchboard.event_ticker t WHERE t.singleton),
              (SELECT l.id_hints FROM switchboard.event_live l WHERE l.singleton AND l.enabled)
         INTO v_id, v_notify, v_hints;
    IF v_id IS NULL THEN
        RAISE EXCEPTION 'user % does not exist', user_id USING ERRCODE = 'P0002';
    END IF;
    v_live := v_hints IS NOT NULL;
    IF v_live THEN
        -- The opt-in path reads the key's pads, its channel and the limit, and the
        -- switches again with them (one row, one snapshot: a switch flipped or a key
        -- rotated since is seen whole).
        SELECT l.max_bytes, l.ipad, l.opad, l.id_hints, l.channel INTO v_max, v_ipad, v_opad, v_hints, v_channel
          FROM switchboard.event_live l WHERE l.singleton AND l.enabled;
        v_live := FOUND;
    END IF;
    -- A hint only: the relay ticks and reads what the ticks say it has not read. One
    -- per transaction is enough (the relay reads everything the next tick covers): the
    -- marker is transaction-local and is undone with a rolled-back subtransaction,
    -- exactly like the NOTIFY it stands for. With publishers_notify off there is none:
    -- the relays' ticker polls (see event_ticker). With the live path on and id_hints
    -- off there is none either: the live message (or its barrier) wakes the relays.
    IF (NOT v_live OR v_hints) AND v_notify
       AND current_setting('switchboard.event_notified', true) IS DISTINCT FROM 'on' THEN
        -- Assignments, not PERFORM: a PERFORM is an executor run of its own, an
        -- assignment of a function call is evaluated directly (pg_notify's void reads
        -- as '').
        v_mark := pg_notify('switchboard_events', '{"id":' || v_id || '}');
        v_mark := set_config('switchboard.event_notified', 'on', true);
    END IF;
    IF v_live THEN
        v_msg := '{"id":' || v_id
              || ',"u":' || coalesce('"' || _publish.user_id::text || '"', 'null')
              || ',"r":' || coalesce(to_json(_publish.room)::text, 'null')
              || ',"e":' || to_json(_publish.event)::text
              || ',"t":' || (extract(epoch FROM v_now) * 1000)::bigint
              || ',"p":' || _publish.payload::text || '}';
        IF octet_length(v_msg) <= v_max THEN
            PERFORM pg_notify(v_channel,
                encode(sha256(v_opad || sha256(v_ipad || convert_to(v_msg, 'UTF8'))), 'hex') || v_msg);
        ELSE
            PERFORM pg_notify(v_channel, '{"b":' || v_id || '}');
        END IF;
    END IF;
    RETURN v_id;
END
$$;
REVOKE ALL ON FUNCTION switchboard._publish(uuid, text, text, jsonb) FROM PUBLIC;

-- Ephemeral events (typing, tool.call.<id>): stored for about a minute in an
-- UNLOGGED table, never in events (no id in the event stream, not resumed).
-- The NOTIFY carries {"eph": id}; relays read the row with relay_read().
CREATE OR REPLACE FUNCTION switchboard._publish_ephemeral(user_id uuid, room text, event text,
                                                          sender uuid, payload jsonb)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    INSERT INTO switchboard.ephemeral_events (user_id, room, event, sender, payload)
    VALUES (_publish_ephemeral.user_id, _publish_ephemeral.room, _publish_ephemeral.event,
            _publish_ephemeral.sender, _publish_ephemeral.payload)
    RETURNING id INTO v_id;
    PERFORM pg_notify('switchboard_events', '{"eph":' || v_id || '}');
    RETURN v_id;
END
$$;
REVOKE ALL ON FUNCTION switchboard._publish_ephemeral(uuid, text, text, uuid, jsonb) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard.notify_user(user_id uuid, event text, payload jsonb DEFAULT '{}')
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF switchboard._event_ok(event, payload, 1048576) IS NOT TRUE THEN
        PERFORM switchboard._check_event(event, payload, 1048576);   -- says which rule, 22023
    END IF;
    IF user_id IS NULL THEN
        RAISE EXCEPTION 'user % does not exist', user_id USING ERRCODE = 'P0002';
    END IF;
    RETURN switchboard._publish(user_id, NULL, event, payload);   -- P0002 for an unknown user
END
$$;
COMMENT ON FUNCTION switchboard.notify_user(uuid, text, jsonb) IS
    'Publish an event to every socket of user_id on every replica, iff the calling transaction commits. Returns the event id (unique, increasing in insert order, not commit order: the delivery order is ticks, see events_since_v2). Payload up to 1 MiB. Takes no lock: publishers never wait for each other.';
REVOKE ALL ON FUNCTION switchboard.notify_user(uuid, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.notify_user(uuid, text, jsonb) TO switchboard_app;

-- A room with no members (or an unknown room) is not an error: the event is
-- stored and delivered to nobody live, like a NOTIFY nobody listens to. A
-- publisher's transaction must not abort because nobody is listening; typos
-- show up in room_members_online() and status(). The name is still checked.
CREATE OR REPLACE FUNCTION switchboard.notify_room(room text, event text, payload jsonb DEFAULT '{}')
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF switchboard._event_ok(event, payload, 1048576) IS NOT TRUE THEN
        PERFORM switchboard._check_event(event, payload, 1048576);   -- says which rule, 22023
    END IF;
    -- 1 to 128 characters, the first a letter or digit (length() and '*', not {0,127}:
    -- see _event_ok).
    IF room IS NULL OR length(room) > 128 OR room !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$' THEN
        RAISE EXCEPTION 'invalid room name "%"', room USING ERRCODE = '22023',
            HINT = 'A room name is 1 to 128 characters: letters, digits, _ . : -';
    END IF;
    RETURN switchboard._publish(NULL, room, event, payload);
END
$$;
COMMENT ON FUNCTION switchboard.notify_room(text, text, jsonb) IS
    'Publish an event to every member of room with a socket joined to it, on every replica, iff the calling transaction commits. Returns the event id. A room without members is not an error (stored, delivered to nobody live). Takes no lock.';
REVOKE ALL ON FUNCTION switchboard.notify_room(text, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.notify_room(text, text, jsonb) TO switchboard_app;

-- Whether an event exists that the tick with snapshot prev does not cover: one
-- written by a transaction at or above prev's xmax, or by one in prev's xip (in
-- progress then). Both are index probes on events_xid whatever the plan (see
-- event_tick; tests/test_events.py counts the sequential scans: none). The
-- caller's snapshot decides what "exists" means: a transaction still in
-- progress now is not seen, so it is covered by a later tick.
CREATE OR REPLACE FUNCTION switchboard._events_unticked(prev pg_snapshot)
RETURNS boolean
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- Each xip entry is probed on its own (LATERAL ... LIMIT 1: an equality on events_xid
    -- per entry). As e.xid = ANY (ARRAY(...)) the generic plan was a sequential scan too.
    RETURN coalesce((SELECT e.xid FROM switchboard.events e ORDER BY e.xid DESC LIMIT 1)
                        >= pg_snapshot_xmax(prev), false)
        OR EXISTS (SELECT 1 FROM pg_snapshot_xip(prev) x(xid)
                    CROSS JOIN LATERAL (SELECT 1 FROM switchboard.events e WHERE e.xid = x.xid LIMIT 1) hit);
END
$$;
REVOKE ALL ON FUNCTION switchboard._events_unticked(pg_snapshot) FROM PUBLIC;

-- The ticker. Whichever relay gets the ticker row (FOR UPDATE SKIP LOCKED)
-- records a tick when events became visible since the last one, and -- when
-- publishers do not NOTIFY (event_ticker.publishers_notify off) -- wakes every
-- relay once for the whole batch ({"tick": k} on switchboard_events).
-- No leader: any replica ticks, a replica dying mid-tick releases the row with
-- its connection, and a skipped caller just tries again (-1 says "busy").
-- The snapshot is taken by the INSERT, a statement after the lock was taken,
-- so it sees the previous tick's transaction committed: each tick's snapshot
-- contains the previous one's, and tick numbers follow snapshot order.
-- It must run in its own transaction: it holds the ticker row until COMMIT.
CREATE OR REPLACE FUNCTION switchboard.event_tick()
RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_prev pg_snapshot;
    v_tick bigint;
    v_floor bigint;
BEGIN
    IF pg_current_xact_id_if_assigned() IS NOT NULL THEN
        RAISE EXCEPTION 'event_tick() called in a transaction that already wrote' USING ERRCODE = '25001',
            HINT = 'Call it in a transaction of its own (autocommit): it holds the ticker row until the transaction ends.';
    END IF;
    -- Read-only first: when nothing became visible since the newest tick (the common
    -- answer for every replica but the first to hear a publisher), no lock, no xid, no
    -- WAL. Whatever woke the caller committed before this statement's snapshot, so
    -- "nothing new" means the newest tick already covers it.
    --
    -- "Anything at or above the last tick's xmax?" is asked as "the highest xid, compared
    -- with it" (V0014). As NOT EXISTS (... WHERE e.xid >= pg_snapshot_xmax(v_prev)) the
    -- cached generic plan of this function chose a sequential scan that stops at the
    -- first match -- and the usual answer is "no match", so every call read the whole
    -- retained table, 3 replicas x every wake-up, which was most of the COMMIT ->
    -- frame latency (BENCHMARKS.md "Issue 18: publishers without a lock"). ORDER BY
    -- xid DESC LIMIT 1 is one descent of events_xid under any plan.
    SELECT k.snap INTO v_prev FROM switchboard.event_ticks k ORDER BY k.tick DESC LIMIT 1;
    IF v_prev IS NOT NULL AND NOT switchboard._events_unticked(v_prev) THEN
        RETURN 0;
    END IF;
    -- The reads' id bounds (V0038). id_floor: the sequence's position read before this
    -- transaction's xid is assigned (the row lock below assigns it; floor_xid records
    -- it). A transaction with a larger xid got it later, and _publish takes its xid
    -- before its event id, so each of its events has an id above id_floor. (A
    -- snapshot's xmax cannot serve: it is the oldest xid not yet completed, and a
    -- larger xid may already be running.) id_ceiling: read in the INSERT, after its
    -- snapshot, so every event the snapshot sees took its id before. event_id_seq has
    -- no cache: ids are taken in order.
    v_floor := switchboard._event_id_allocated();
    PERFORM 1 FROM switchboard.event_ticker t WHERE t.singleton FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN -1;
    END IF;
    SELECT k.snap INTO v_prev FROM switchboard.event_ticks k ORDER BY k.tick DESC LIMIT 1;
    INSERT INTO switchboard.event_ticks (tick, snap, snap_xmax, id_floor, floor_xid, id_ceiling)
    SELECT nextval('switchboard.event_tick_seq'), pg_current_snapshot(), pg_snapshot_xmax(pg_current_snapshot()),
           v_floor, pg_current_xact_id(), switchboard._event_id_allocated()
     WHERE v_prev IS NULL OR switchboard._events_unticked(v_prev)
    RETURNING tick INTO v_tick;
    IF v_tick IS NULL THEN
        RETURN 0;
    END IF;
    -- The batch's one wake-up, needed only when publishers are silent: otherwise every
    -- relay heard the publisher and ticks (or finds the tick) itself, and a NOTIFY here
    -- would put NOTIFY's commit lock on every delivery's path for nothing.
    IF NOT (SELECT t.publishers_notify FROM switchboard.event_ticker t WHERE t.singleton) THEN
        PERFORM pg_notify('switchboard_events', '{"tick":' || v_tick || '}');
    END IF;
    RETURN v_tick;
END
$$;
COMMENT ON FUNCTION switchboard.event_tick() IS
    'The ticker (relays after each wake-up; reap_events when no relay ticks; a DBA reading events from psql alone): record a tick if events became visible since the last one (and NOTIFY {"tick": k} once for the batch when publishers_notify is off). Returns the new tick, 0 if nothing new, -1 if another replica is ticking right now (try again shortly). Run it in a transaction of its own.';
REVOKE ALL ON FUNCTION switchboard.event_tick() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.event_tick() TO switchboard_app;

-- Every read of the event stream: the events after position (after_tick,
-- after_id) in (batch, id) order, through tick through_tick (NULL: the newest),
-- at most max_rows; only_user NULL for all events, else that user's own events
-- and those of the given rooms it is a member of. after_id = 9223372036854775807
-- means "all of after_tick's batch". Works in windows of up to 500 ticks so a
-- long catch-up reads each event once: candidates are found by events_xid
-- (not visible in the window's first snapshot, below the last one's xmax), and
-- each candidate's batch is the first tick in the window whose snapshot sees
-- it. A position older than the retained ticks reads from the oldest one (the
-- caller decides about resume_gap with event_window()).
--
-- plan_cache_mode = force_generic_plan (V0014): every relay runs this on every
-- wake-up. Under the default (auto) PL/pgSQL compared the generic plan of the
-- main query (estimated for any window) with the custom ones (estimated for a
-- window of a few ticks), kept choosing custom plans, and so planned the
-- LATERAL join again on every call: most of the call was planning, not executing
-- (pgbench, auto against forced generic, alternating: BENCHMARKS.md "Issue 18:
-- publishers without a lock", V0014). The generic plans are the
-- same index paths (events_xid bitmap, event_ticks_pkey).
--
-- jit = off: the generic plan's estimate scales with the retained events (about
-- 5 % of them, each with a LATERAL probe of event_ticks), not with the few rows a
-- wake-up reads. Past ~200,000 retained events it crosses jit_above_cost (100,000,
-- on by default), and with it jit_optimize_above_cost: PostgreSQL then compiled
-- the query at every call, 1.2-1.7 s of JIT for a read that executes in under
-- 2 ms (bench/events_partition_ops.py; BENCHMARKS.md "Issue 35").
CREATE OR REPLACE FUNCTION switchboard._events_after(
    only_user uuid, rooms text[], after_tick bigint, after_id bigint, through_tick bigint, max_rows integer)
RETURNS TABLE (tick bigint, id bigint, user_id uuid, room text, event text, payload jsonb, created_at timestamptz)
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_variable
DECLARE
    v_lo bigint;
    v_lo_snap pg_snapshot;
    v_lo_xip xid8[];
    v_hi bigint;
    v_hi_snap pg_snapshot;
    v_left integer := max_rows;
    v_n integer;
    v_rooms text[] := '{}';
    v_floor bigint;
    v_ceiling bigint;
BEGIN
    SELECT k.tick, k.snap INTO v_lo, v_lo_snap FROM switchboard.event_ticks k
     WHERE k.tick < after_tick OR (k.tick = after_tick AND after_id = 9223372036854775807)
     ORDER BY k.tick DESC LIMIT 1;
    IF v_lo IS NULL THEN
        v_lo := 0;
        v_lo_snap := '1:1:'::pg_snapshot;   -- before every retained tick: nothing seen
    END IF;
    -- The ids a read can meet (V0038), so the plan prunes the partitions of events to
    -- them. Every row it returns has an xid not visible in v_lo_snap, so at least that
    -- snapshot's xmin. A tick whose own xid (floor_xid) is below that xmin read its
    -- id_floor before any such xid was assigned, and _publish takes its xid before
    -- its id: each row's id is above that tick's id_floor. The newest such tick (the
    -- largest such floor_xid: it grows with tick) gives the tightest bound; none
    -- retained, or one from before V0038: no bound. A long transaction holds xmin
    -- back, so the bound is older, never wrong. id_ceiling bounds each window from
    -- above.
    SELECT k.id_floor INTO v_floor FROM switchboard.event_ticks k
     WHERE k.floor_xid < pg_snapshot_xmin(v_lo_snap)
     ORDER BY k.floor_xid DESC LIMIT 1;    -- event_ticks_floor: one descent
    v_floor := coalesce(v_floor, -1);
    IF only_user IS NOT NULL THEN
        v_rooms := ARRAY(SELECT m.room FROM switchboard.room_members m
                          WHERE m.user_id = only_user AND m.room = ANY (coalesce(rooms, '{}')));
    END IF;
    LOOP
        SELECT w.tick, w.snap, w.id_ceiling INTO v_hi, v_hi_snap, v_ceiling FROM (
            SELECT k.tick, k.snap, k.id_ceiling FROM switchboard.event_ticks k
             WHERE k.tick > v_lo AND (through_tick IS NULL OR k.tick <= through_tick)
             ORDER BY k.tick LIMIT 500) w
         ORDER BY w.tick DESC LIMIT 1;
        EXIT WHEN v_hi IS NULL;
        v_ceiling := coalesce(v_ceiling, 9223372036854775807);
        v_lo_xip := ARRAY(SELECT pg_snapshot_xip(v_lo_snap));
        RETURN QUERY
        SELECT b.tick, e.id, e.user_id, e.room, e.event, e.payload, e.created_at
          FROM switchboard.events e
         CROSS JOIN LATERAL (
                SELECT k.tick FROM switchboard.event_ticks k
                 WHERE k.tick > v_lo AND k.tick <= v_hi AND pg_visible_in_snapshot(e.xid, k.snap)
                 ORDER BY k.tick LIMIT 1) b
         WHERE ((e.xid >= pg_snapshot_xmax(v_lo_snap) AND e.xid < pg_snapshot_xmax(v_hi_snap))
                OR e.xid = ANY (v_lo_xip))
           AND e.id > v_floor AND e.id <= v_ceiling
           AND (only_user IS NULL OR e.user_id = only_user OR e.room = ANY (v_rooms))
           AND (b.tick > after_tick OR (b.tick = after_tick AND e.id > after_id))
         ORDER BY b.tick, e.id
         LIMIT v_left;
        GET DIAGNOSTICS v_n = ROW_COUNT;
        v_left := v_left - v_n;
        EXIT WHEN v_left <= 0;
        v_lo := v_hi;
        v_lo_snap := v_hi_snap;
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION switchboard._events_after(uuid, text[], bigint, bigint, bigint, integer) FROM PUBLIC;

CREATE OR REPLACE FUNCTION switchboard._check_position(after_tick bigint, after_id bigint, max_rows integer)
RETURNS void
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF after_tick IS NULL OR after_tick < 0 OR after_id IS NULL OR after_id < 0 THEN
        RAISE EXCEPTION 'invalid position (%, %)', after_tick, after_id USING ERRCODE = '22023',
            HINT = 'A position is (tick, last event id) from an event''s cursor; (0, 0) is the start of what is retained.';
    END IF;
    IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 100000 THEN
        RAISE EXCEPTION 'invalid max_rows %', max_rows USING ERRCODE = '22023', HINT = 'Between 1 and 100000.';
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._check_position(bigint, bigint, integer) FROM PUBLIC;

-- The resume read (the v2 of events_since: a position instead of an id).
CREATE OR REPLACE FUNCTION switchboard.events_since_v2(
    user_id uuid, after_tick bigint, after_id bigint, rooms text[] DEFAULT '{}',
    through_tick bigint DEFAULT NULL, max_rows integer DEFAULT 10000)
RETURNS TABLE (tick bigint, id bigint, room text, event text, payload jsonb, created_at timestamptz)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM switchboard._check_position(after_tick, after_id, max_rows);
    IF user_id IS NULL THEN
        RAISE EXCEPTION 'user_id must not be NULL' USING ERRCODE = '22023', HINT = 'Whose events to read.';
    END IF;
    RETURN QUERY
    SELECT a.tick, a.id, a.room, a.event, a.payload, a.created_at
      FROM switchboard._events_after(user_id, rooms, after_tick, after_id, through_tick, max_rows) a;
END
$$;
COMMENT ON FUNCTION switchboard.events_since_v2(uuid, bigint, bigint, text[], bigint, integer) IS
    'What user_id missed after the position (after_tick, after_id) -- an event frame''s cursor -- through tick through_tick (NULL: the newest): its own events and events of the given rooms it belongs to, in delivery order (tick, then id). Exact under any commit order: every event after the position exactly once. Only events in a tick are read: one committed since the newest tick comes with a later read (relays tick within milliseconds of a COMMIT; from psql alone call event_tick() first). after_id 9223372036854775807 = all of after_tick. Compare with event_window() for resume_gap.';
REVOKE ALL ON FUNCTION switchboard.events_since_v2(uuid, bigint, bigint, text[], bigint, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.events_since_v2(uuid, bigint, bigint, text[], bigint, integer) TO switchboard_app;

-- The relay's read (V0021): the retained window first, then the rows, in ONE
-- snapshot (a STABLE function sees its calling statement's snapshot). A relay
-- whose position fell below the window -- events after it reaped before it read
-- them, after a stall of any kind -- knows it from the read itself and sends
-- resume_gap; before, a relay compared its position with event_window() only
-- after a reconnect and otherwise skipped the reaped events silently.
CREATE OR REPLACE FUNCTION switchboard.relay_read_v3(after_tick bigint, after_id bigint,
                                                     ephemeral_ids bigint[] DEFAULT '{}',
                                                     max_rows integer DEFAULT 1000)
RETURNS TABLE (kind text, tick bigint, id bigint, user_id uuid, room text, event text, sender uuid,
               payload jsonb, ts bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM switchboard._check_position(after_tick, after_id, max_rows);
    IF cardinality(ephemeral_ids) > 10000 THEN
        RAISE EXCEPTION 'too many ephemeral ids (%)', cardinality(ephemeral_ids) USING ERRCODE = '22023',
            HINT = 'At most 10000 per read.';
    END IF;
    RETURN QUERY
    SELECT 'window'::text, h.reaped_tick, h.reaped_through, NULL::uuid, NULL::text, NULL::text, NULL::uuid,
           NULL::jsonb, NULL::bigint
      FROM switchboard.event_horizon h;
    RETURN QUERY
    SELECT 'event'::text, a.tick, a.id, a.user_id, a.room, a.event, NULL::uuid, a.payload,
           (extract(epoch FROM a.created_at) * 1000)::bigint
      FROM switchboard._events_after(NULL, NULL, after_tick, after_id, NULL, max_rows) a;
    RETURN QUERY
    SELECT 'ephemeral'::text, NULL::bigint, x.id, x.user_id, x.room, x.event, x.sender, x.payload,
           (extract(epoch FROM x.created_at) * 1000)::bigint
      FROM switchboard.ephemeral_events x
     WHERE x.id = ANY (coalesce(ephemeral_ids, '{}'))
       AND x.created_at > now() - interval '30 seconds'
     ORDER BY x.id;
END
$$;
COMMENT ON FUNCTION switchboard.relay_read_v3(bigint, bigint, bigint[], integer) IS
    'Internal (relay): first one row kind ''window'' (tick = event_window().first_tick, id = reaped_through: a position below it means events after it were reaped unread, so resume_gap), then kind ''event'' rows: stored events after the position (after_tick, after_id) in delivery order (tick, then id; at most max_rows), then kind ''ephemeral'' rows with the given ids (younger than 30 s). All in one snapshot. SQLSTATE 22023 for a bad position, max_rows or more than 10000 ids (HINT says the bounds).';
REVOKE ALL ON FUNCTION switchboard.relay_read_v3(bigint, bigint, bigint[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.relay_read_v3(bigint, bigint, bigint[], integer) TO switchboard_app;

-- 0.2.x relays read with relay_read_v2 while they run beside this release's
-- (a rolling update from 0.2): the same read without the window row, so such a
-- relay learns of reaped events only when it compares its position with
-- event_window(), which it does after a LISTEN reconnect.
CREATE OR REPLACE FUNCTION switchboard.relay_read_v2(after_tick bigint, after_id bigint,
                                                     ephemeral_ids bigint[] DEFAULT '{}',
                                                     max_rows integer DEFAULT 1000)
RETURNS TABLE (tick bigint, id bigint, ephemeral boolean, user_id uuid, room text, event text, sender uuid,
               payload jsonb, ts bigint)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT r.tick, r.id, r.kind = 'ephemeral', r.user_id, r.room, r.event, r.sender, r.payload, r.ts
      FROM switchboard.relay_read_v3(after_tick, after_id, ephemeral_ids, max_rows) r
     WHERE r.kind <> 'window'
$$;
COMMENT ON FUNCTION switchboard.relay_read_v2(bigint, bigint, bigint[], integer) IS
    'The 0.2.x relay''s read, kept for a rolling update from 0.2 (this release''s relays call relay_read_v3): relay_read_v3 without its window row. Stored events after the position (after_tick, after_id) in delivery order (tick, then id; at most max_rows), then the ephemeral events with the given ids (younger than 30 s). It does not say whether events after the position were reaped: a position below event_window().first_tick reads on from the oldest retained tick with no sign of the gap (compare with event_window() yourself, or use relay_read_v3).';
REVOKE ALL ON FUNCTION switchboard.relay_read_v2(bigint, bigint, bigint[], integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.relay_read_v2(bigint, bigint, bigint[], integer) TO switchboard_app;

-- What a relay missed while its LISTEN connection was down (V0019). Stored events
-- are read again from the relay's position after a reconnect; ephemeral events
-- (tool.call.<id>, typing) have no position, so their hints were simply lost and
-- a tool call to a user on that replica waited out its timeout (504). The relay
-- asks, on each reconnect, for the ids created within `lookback` (the time it
-- was down, plus a margin, at most the 30 s that relay_read_v3 still reads) and
-- reads the ones it has not seen through relay_read_v3 as usual: it acts on rows,
-- never on a hint. Newest first, at most max_rows.
CREATE OR REPLACE FUNCTION switchboard.relay_ephemeral_missed(lookback interval, max_rows integer DEFAULT 10000)
RETURNS TABLE (id bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF lookback IS NULL OR lookback < interval '0' OR lookback > interval '30 seconds' THEN
        RAISE EXCEPTION 'invalid lookback "%"', lookback USING ERRCODE = '22023',
            HINT = 'Between 0 and 30 seconds: relay_read_v3 reads ephemeral events younger than 30 s.';
    END IF;
    IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 10000 THEN
        RAISE EXCEPTION 'invalid max_rows %', max_rows USING ERRCODE = '22023',
            HINT = 'Between 1 and 10000 (relay_read_v3 takes at most 10000 ephemeral ids per read).';
    END IF;
    RETURN QUERY
    SELECT x.id FROM switchboard.ephemeral_events x
     WHERE x.created_at > now() - lookback
     ORDER BY x.id DESC
     LIMIT max_rows;
END
$$;
COMMENT ON FUNCTION switchboard.relay_ephemeral_missed(interval, integer) IS
    'Internal (relay): ids of the ephemeral events created within lookback (at most 30 s), newest first, at most max_rows. A relay calls it after a LISTEN reconnect and reads those it has not delivered with relay_read_v3.';
REVOKE ALL ON FUNCTION switchboard.relay_ephemeral_missed(interval, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.relay_ephemeral_missed(interval, integer) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.event_window()
RETURNS TABLE (first_tick bigint, last_tick bigint, reaped_through bigint, publishers_notify boolean)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    SELECT h.reaped_tick, coalesce((SELECT max(k.tick) FROM switchboard.event_ticks k), h.reaped_tick),
           h.reaped_through, (SELECT t.publishers_notify FROM switchboard.event_ticker t WHERE t.singleton)
      FROM switchboard.event_horizon h;
END
$$;
COMMENT ON FUNCTION switchboard.event_window()
    IS 'The retained stream: a position (tick, id) is complete iff tick > first_tick, or tick = first_tick with id 9223372036854775807 (all of it); anything older gets resume_gap. last_tick is the newest tick (a relay''s starting position is (last_tick, 9223372036854775807)); reaped_through the highest event id reaped; publishers_notify whether publishers NOTIFY (false: relays poll event_tick()).';
REVOKE ALL ON FUNCTION switchboard.event_window() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.event_window() TO switchboard_app;

-- A bare event id (a 0.1 client's resume cursor, ?after=<id>, and hello's last_id)
-- as a position: the batch that made it visible. Exact for a client that processed frames in
-- delivery order: having seen event N it has seen everything before (batch(N), N).
CREATE OR REPLACE FUNCTION switchboard.event_batch(event_id bigint)
RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT b.tick FROM switchboard.events e
             CROSS JOIN LATERAL (SELECT k.tick FROM switchboard.event_ticks k
                                  WHERE k.snap_xmax > e.xid AND pg_visible_in_snapshot(e.xid, k.snap)
                                  ORDER BY k.snap_xmax, k.tick LIMIT 1) b
             WHERE e.id = event_id);
END
$$;
COMMENT ON FUNCTION switchboard.event_batch(bigint) IS
    'The tick whose batch holds event event_id (its position is (tick, event_id)); NULL if the event is not retained or not in a tick yet.';
REVOKE ALL ON FUNCTION switchboard.event_batch(bigint) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.event_batch(bigint) TO switchboard_app;

-- Partitions of events (V0037). switchboard.events is PARTITION BY RANGE (id):
-- partitions events_p<first id> ahead of event_id_seq (events_partitions_ensure),
-- events_p0 (what V0037 found) and a DEFAULT partition, events_default, for ids no
-- partition covers. Retention drops whole partitions (_events_drop_partitions,
-- from reap_events). Every function below also loads at older migration targets
-- (events not partitioned): each checks first and does nothing there.

-- Whether events is partitioned (V0037 applied).
CREATE OR REPLACE FUNCTION switchboard._events_partitioned()
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT coalesce((SELECT c.relkind = 'p' FROM pg_class c WHERE c.oid = to_regclass('switchboard.events')), false)
$$;
REVOKE ALL ON FUNCTION switchboard._events_partitioned() FROM PUBLIC;

-- The highest id event_id_seq has given out (0: none). Not transactional: what any
-- session took so far, committed or not.
CREATE OR REPLACE FUNCTION switchboard._event_id_allocated()
RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN (SELECT CASE WHEN s.is_called THEN s.last_value ELSE s.last_value - 1 END FROM switchboard.event_id_seq s);
END
$$;
REVOKE ALL ON FUNCTION switchboard._event_id_allocated() FROM PUBLIC;

-- The DBA's view of the layout: one row per partition, from the catalog (so a
-- partition a DBA added by hand is seen too). from_id NULL: MINVALUE; to_id is
-- exclusive. allocated: every id of the range was given out (the sequence is past
-- it), so no new row can land in it.
CREATE OR REPLACE FUNCTION switchboard.event_partitions()
RETURNS TABLE (partition_name text, from_id bigint, to_id bigint, is_default boolean, allocated boolean,
               approx_rows bigint)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_last bigint;
BEGIN
    IF NOT switchboard._events_partitioned() THEN
        RETURN;
    END IF;
    v_last := switchboard._event_id_allocated();
    RETURN QUERY
    SELECT b.relname::text, b.lo, b.hi, b.dflt, NOT b.dflt AND b.hi IS NOT NULL AND b.hi - 1 <= v_last,
           greatest(b.reltuples, 0)::bigint
      FROM (SELECT c.relname, c.reltuples, m.bound = 'DEFAULT' AS dflt,
                   nullif(btrim(r[1], ''''), 'MINVALUE')::bigint AS lo,
                   nullif(btrim(r[2], ''''), 'MAXVALUE')::bigint AS hi
              FROM pg_inherits i
              JOIN pg_class c ON c.oid = i.inhrelid
             CROSS JOIN LATERAL (SELECT pg_get_expr(c.relpartbound, c.oid) AS bound) m
              LEFT JOIN LATERAL regexp_match(m.bound, 'FROM \(([^)]*)\) TO \(([^)]*)\)') r ON true
             WHERE i.inhparent = 'switchboard.events'::regclass) b
     ORDER BY b.dflt, b.lo NULLS FIRST;
END
$$;
COMMENT ON FUNCTION switchboard.event_partitions() IS
    'The partitions of switchboard.events (V0037), oldest first, then the DEFAULT one: name, id range [from_id, to_id) (from_id NULL: MINVALUE), is_default, allocated (event_id_seq is past the range: no new row can land in it, so reap_events may drop it once every row is reapable), approx_rows (pg_class.reltuples; -1 before the first ANALYZE reads as 0). No rows at a migration target before V0037.';
REVOKE ALL ON FUNCTION switchboard.event_partitions() FROM PUBLIC;

-- Partitions ahead (V0037), called by reap_events (both forms) at the end of each
-- call, so by maintenance() every sweep. Keeps event_partitioning.ahead (2) partitions
-- above event_id_seq with no id given out yet; each new one spans max(min_span, the
-- ids published over the last keep window), so a partition holds about one retention
-- window and retention keeps about two of them.
--
-- CREATE TABLE + ATTACH PARTITION, never CREATE TABLE ... PARTITION OF: ATTACH takes
-- SHARE UPDATE EXCLUSIVE on events (publishers and readers go on), PARTITION OF takes
-- ACCESS EXCLUSIVE. With a DEFAULT partition ATTACH also takes ACCESS EXCLUSIVE on
-- events_default (and scans it for rows of the new range), which blocks relay reads
-- (a read locks every partition) until the caller's transaction ends: taken first,
-- explicitly, under event_partitioning.lock_timeout, and a creation whose lock is not
-- granted is skipped (creates_skipped) and tried again at the next sweep. It happens
-- once per partition, i.e. about once per retention window.
--
-- Where the next partition starts. Normally at the top of the last one: a partition is
-- created when fewer than `ahead` lie wholly above the sequence, so with ahead >= 2 at
-- least one whole partition (min_span ids or more) separates the sequence from the new
-- range, and no id of the new range is given out before this transaction commits
-- unless that many are published meanwhile (the residual risk: such a publish would
-- fail, see below). When the sequence outran the partitions ahead (a burst; its ids
-- landed in events_default), above them: a publisher that routed a row to
-- events_default before this ATTACH commits inserts it after (it waits for the lock),
-- and PostgreSQL then checks the row against the DEFAULT partition's new constraint
-- (23514 if it falls in the new range). Ids given out from here on that go to
-- events_default wait for the lock, at most one per session, so the new range starts
-- max_connections above both the sequence and events_default's highest id.
CREATE OR REPLACE FUNCTION switchboard.events_partitions_ensure(keep interval DEFAULT '5 minutes')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
AS $$
DECLARE
    v_min_span bigint;
    v_ahead integer;
    v_timeout interval;
    v_last bigint;
    v_have integer;
    v_top bigint;
    v_span bigint;
    v_lo bigint;
    v_headroom bigint := current_setting('max_connections')::bigint;
    v_name text;
    v_n integer := 0;
BEGIN
    IF keep IS NULL OR keep < interval '0' THEN
        RAISE EXCEPTION 'invalid keep interval "%"', keep USING ERRCODE = '22023',
            HINT = 'keep is the resume window, e.g. ''5 minutes'': a partition spans the ids published over it.';
    END IF;
    IF NOT switchboard._events_partitioned() THEN
        RETURN 0;
    END IF;
    -- Cheap check first (every sweep): enough partitions ahead?
    v_last := switchboard._event_id_allocated();
    SELECT c.ahead INTO v_ahead FROM switchboard.event_partitioning c WHERE c.singleton;
    SELECT count(*) FILTER (WHERE p.from_id > v_last) INTO v_have
      FROM switchboard.event_partitions() p WHERE NOT p.is_default;
    IF v_have >= v_ahead THEN
        RETURN 0;
    END IF;
    -- One creator at a time (the row lock), then the knobs.
    SELECT c.min_span, c.ahead, c.lock_timeout INTO v_min_span, v_ahead, v_timeout
      FROM switchboard.event_partitioning c WHERE c.singleton FOR UPDATE;
    -- The ids published over the last keep window: from the oldest event created in
    -- it (one descent of events_created per partition) to the sequence.
    SELECT v_last - e.id INTO v_span FROM switchboard.events e
     WHERE e.created_at >= now() - keep ORDER BY e.created_at LIMIT 1;
    v_span := greatest(v_min_span, coalesce(v_span, 0));
    BEGIN
        PERFORM set_config('lock_timeout', (extract(epoch FROM v_timeout) * 1000)::bigint || 'ms', true);
        LOCK TABLE switchboard.events_default IN ACCESS EXCLUSIVE MODE;
        v_last := switchboard._event_id_allocated();
        LOOP
            SELECT count(*) FILTER (WHERE p.from_id > v_last), max(p.to_id) INTO v_have, v_top
              FROM switchboard.event_partitions() p WHERE NOT p.is_default;
            EXIT WHEN v_have >= v_ahead;
            v_lo := v_top;
            IF v_lo IS NULL OR v_lo <= v_last THEN
                -- Outrun: start above every id that may be in flight (each session waits
                -- for events_default's lock with at most one) and above events_default's rows.
                v_lo := greatest(v_last, coalesce((SELECT max(d.id) FROM switchboard.events_default d), 0))
                        + v_headroom + 1;
            END IF;
            v_name := 'events_p' || v_lo;
            EXECUTE format('CREATE TABLE switchboard.%I (LIKE switchboard.events INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING COMMENTS)',
                           v_name);
            EXECUTE format('REVOKE ALL ON TABLE switchboard.%I FROM PUBLIC', v_name);
            EXECUTE format('ALTER TABLE switchboard.events ATTACH PARTITION switchboard.%I FOR VALUES FROM (%s) TO (%s)',
                           v_name, v_lo, v_lo + v_span);
            EXECUTE format('COMMENT ON TABLE switchboard.%I IS %L', v_name,
                           format('Partition of switchboard.events: ids %s to %s, created ahead by events_partitions_ensure() at %s. Dropped by reap_events once every row of it is reapable.',
                                  v_lo, v_lo + v_span - 1, now()));
            v_n := v_n + 1;
        END LOOP;
    EXCEPTION WHEN lock_not_available THEN
        UPDATE switchboard.event_partitioning SET creates_skipped = creates_skipped + 1 WHERE singleton;
        RETURN 0;
    END;
    IF v_n > 0 THEN
        UPDATE switchboard.event_partitioning SET created = created + v_n, last_create_at = now() WHERE singleton;
    END IF;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.events_partitions_ensure(interval) IS
    'Keep event_partitioning.ahead (default 2) partitions of events above event_id_seq, each spanning max(event_partitioning.min_span, the ids published over the last keep): CREATE TABLE + ATTACH PARTITION (SHARE UPDATE EXCLUSIVE on events), not CREATE TABLE ... PARTITION OF (ACCESS EXCLUSIVE). Takes ACCESS EXCLUSIVE on events_default under event_partitioning.lock_timeout; not granted: skipped (creates_skipped), 0. After a burst that outran the partitions the next one starts above the ids in events_default. reap_events calls it every sweep; returns how many partitions it created. Nothing before V0037.';
REVOKE ALL ON FUNCTION switchboard.events_partitions_ensure(interval) FROM PUBLIC;

-- Retention by partition (V0037), called by reap_events (both forms) at the end of
-- each call with the snapshot of the cut (event_horizon.reaped_tick). A partition goes
-- only when every row of it is reapable: its range is allocated (the sequence is past
-- it: no new row can come) and no row has a transaction not visible in the cut's
-- snapshot. Oldest first; the first partition that does not qualify stops the sweep.
--
-- The race: a publisher that took an id in the range may not have committed yet, and
-- this snapshot does not see its row. So the locks come first: ACCESS EXCLUSIVE on the
-- parent (ONLY) and then on the partition, under event_partitioning.lock_timeout. The
-- parent's lock waits for every transaction that published (each holds ROW EXCLUSIVE
-- on events until it ends), and DETACH needs it anyway (DETACH ... CONCURRENTLY, which
-- does not, cannot run in a function or a transaction block). Parent first: a reader
-- locks the parent, then every partition; the other order could deadlock with it.
-- Then the check again, in a new statement (READ COMMITTED: a fresh snapshot that sees
-- every row committed before the lock), then DETACH, and the table is renamed
-- events_detached_<first id>; the next sweep DROPs it (see below why not now). A lock not granted, or a
-- row that committed meanwhile, skips the partition until the next sweep
-- (drops_skipped): the subtransaction is rolled back, which releases its locks.
--
-- While the parent's lock is requested and held (until the caller's transaction ends)
-- publishers and relay reads wait: at most lock_timeout plus the rest of the caller's
-- transaction, once per partition (BENCHMARKS.md "Issue 35: events retention").
-- Returns the number of rows dropped; reaped_through moves to the highest id dropped.
CREATE OR REPLACE FUNCTION switchboard._events_drop_partitions(cut pg_snapshot)
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '100ms'
AS $$
DECLARE
    v_part record;
    v_xmax xid8 := pg_snapshot_xmax(cut);
    v_xip xid8[] := ARRAY(SELECT pg_snapshot_xip(cut));
    v_rows bigint;
    v_max bigint;
    v_late boolean;
    v_timeout interval;
    v_total bigint := 0;
    v_dropped integer := 0;
    v_skipped integer := 0;
    v_name text;
    v_names text[] := '{}';
    v_counts bigint[] := '{}';
    v_maxes bigint[] := '{}';
    -- Whether a row of the partition is not visible in the cut: a transaction at or
    -- above its xmax (the highest xid: one descent of the partition's events_xid), or
    -- one in its xip (an equality probe each). Index paths whatever the statistics: as
    -- EXISTS (... WHERE xid >= $1) a partition never analyzed was read sequentially,
    -- 125 ms for 1,000,000 rows, under the lock that stalls every publisher.
    v_check text := 'SELECT coalesce((SELECT e.xid FROM switchboard.%1$I e ORDER BY e.xid DESC LIMIT 1) >= $1, false) '
                    '    OR EXISTS (SELECT 1 FROM unnest($2::xid8[]) x(xid) '
                    '                CROSS JOIN LATERAL (SELECT 1 FROM switchboard.%1$I e WHERE e.xid = x.xid LIMIT 1) hit)';
BEGIN
    IF cut IS NULL OR NOT switchboard._events_partitioned()
       OR current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN 0;   -- the re-check needs a fresh snapshot per statement
    END IF;
    SELECT c.lock_timeout INTO v_timeout FROM switchboard.event_partitioning c WHERE c.singleton;
    -- What the previous sweeps detached goes now, in a transaction of its own: a DROP
    -- unlinks the files at COMMIT (40 to 120 ms for 1,000,000 events here), before the
    -- locks are released, so dropping in the detaching transaction would have stalled
    -- every publisher that long. Nobody reads a detached table; this DROP locks it alone.
    FOR v_part IN SELECT c.relname AS partition_name FROM pg_class c
                   WHERE c.relnamespace = 'switchboard'::regnamespace AND c.relkind = 'r'
                     AND c.relname LIKE 'events\_detached\_%'
                     AND NOT EXISTS (SELECT 1 FROM pg_inherits i WHERE i.inhrelid = c.oid) LOOP
        EXECUTE format('DROP TABLE switchboard.%I', v_part.partition_name);
    END LOOP;
    -- First, without a lock, every partition that qualifies now (index probes on its
    -- events_xid) and what it holds: the counts read whole partitions, and once the
    -- first partition is detached this transaction holds events' lock, so nothing slow
    -- may come after it (counting a partition of 1,000,000 rows under the lock was a
    -- 0.1 s stall for every publisher).
    FOR v_part IN SELECT p.partition_name FROM switchboard.event_partitions() p
                   WHERE p.allocated ORDER BY p.to_id LOOP
        EXECUTE format(v_check, v_part.partition_name) INTO v_late USING v_xmax, v_xip;
        EXIT WHEN v_late;
        EXECUTE format('SELECT count(*), max(e.id) FROM switchboard.%I e', v_part.partition_name)
           INTO v_rows, v_max;
        v_names := v_names || v_part.partition_name::text;
        v_counts := v_counts || v_rows;
        v_maxes := v_maxes || v_max;
    END LOOP;
    FOR i IN 1 .. coalesce(array_length(v_names, 1), 0) LOOP
        v_name := v_names[i];
        v_rows := v_counts[i];
        v_max := v_maxes[i];
        BEGIN
            PERFORM set_config('lock_timeout', (extract(epoch FROM v_timeout) * 1000)::bigint || 'ms', true);
            LOCK TABLE ONLY switchboard.events IN ACCESS EXCLUSIVE MODE;
            EXECUTE format('LOCK TABLE switchboard.%I IN ACCESS EXCLUSIVE MODE', v_name);
            -- Again, in a new statement: every transaction that wrote here has ended.
            -- A row that committed since the first check is not visible in the cut
            -- (it committed after it), so it shows here.
            EXECUTE format(v_check, v_name) INTO v_late USING v_xmax, v_xip;
            IF v_late THEN
                RAISE EXCEPTION USING ERRCODE = 'lock_not_available';   -- undo the locks, skip
            END IF;
            EXECUTE format('ALTER TABLE switchboard.events DETACH PARTITION switchboard.%I', v_name);
            EXECUTE format('ALTER TABLE switchboard.%I RENAME TO %I', v_name,
                           'events_detached_' || substr(v_name, 9));
            EXECUTE format('COMMENT ON TABLE switchboard.%I IS %L', 'events_detached_' || substr(v_name, 9),
                           format('Detached from switchboard.events by reap_events at %s (every row reapable); dropped by the next sweep.', now()));
        EXCEPTION WHEN lock_not_available THEN
            v_skipped := v_skipped + 1;
            EXIT;
        END;
        v_total := v_total + v_rows;
        v_dropped := v_dropped + 1;
        IF v_max IS NOT NULL THEN
            UPDATE switchboard.event_horizon SET reaped_through = greatest(reaped_through, v_max);
        END IF;
    END LOOP;
    IF v_dropped > 0 OR v_skipped > 0 THEN
        UPDATE switchboard.event_partitioning
           SET dropped = dropped + v_dropped, drops_skipped = drops_skipped + v_skipped,
               last_drop_at = CASE WHEN v_dropped > 0 THEN now() ELSE last_drop_at END
         WHERE singleton;
    END IF;
    RETURN v_total;
END
$$;
REVOKE ALL ON FUNCTION switchboard._events_drop_partitions(pg_snapshot) FROM PUBLIC;

-- Rows of events_default (a burst outran the partitions ahead), 0 before V0037.
CREATE OR REPLACE FUNCTION switchboard._events_default_rows()
RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT switchboard._events_partitioned() THEN
        RETURN 0;
    END IF;
    RETURN (SELECT count(*) FROM switchboard.events_default);
END
$$;
REVOKE ALL ON FUNCTION switchboard._events_default_rows() FROM PUBLIC;

-- What the SwitchboardEventsNotReaped alert watches (metrics_snapshot's
-- event_backlog_seconds), in seconds. Before V0037: the age of the oldest stored event
-- (row reaping keeps it near keep). Since: events stay until their whole partition can
-- go, so the oldest stored event of a quiet installation is as old as its partition
-- took to fill (hours at one event a second): the age of the newest event of the
-- oldest allocated partition (one that only waits for its rows to be reapable, about
-- keep after that event), or of the oldest event in events_default (deleted row by row
-- once reapable), whichever is older. Index probes (events_created) per partition.
CREATE OR REPLACE FUNCTION switchboard._event_backlog_seconds()
RETURNS double precision
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_part text;
    v_at timestamptz;
    v_oldest timestamptz;
BEGIN
    IF NOT switchboard._events_partitioned() THEN
        RETURN coalesce(extract(epoch FROM now() - (SELECT min(e.created_at) FROM switchboard.events e)), 0);
    END IF;
    SELECT min(d.created_at) INTO v_oldest FROM switchboard.events_default d;
    SELECT p.partition_name INTO v_part FROM switchboard.event_partitions() p
     WHERE p.allocated ORDER BY p.to_id LIMIT 1;
    IF v_part IS NOT NULL THEN
        EXECUTE format('SELECT max(e.created_at) FROM switchboard.%I e', v_part) INTO v_at;
        v_oldest := least(v_oldest, v_at);
    END IF;
    RETURN greatest(coalesce(extract(epoch FROM now() - v_oldest), 0), 0);
END
$$;
REVOKE ALL ON FUNCTION switchboard._event_backlog_seconds() FROM PUBLIC;

-- How many partitions lie wholly above event_id_seq (what events_partitions_ensure
-- keeps at event_partitioning.ahead); NULL before V0037.
CREATE OR REPLACE FUNCTION switchboard._event_partitions_ahead()
RETURNS bigint
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF NOT switchboard._events_partitioned() THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT count(*) FROM switchboard.event_partitions() p
             WHERE NOT p.is_default AND p.from_id > switchboard._event_id_allocated());
END
$$;
REVOKE ALL ON FUNCTION switchboard._event_partitions_ahead() FROM PUBLIC;

-- Row-by-row retention where there is no partition to drop: events_default since
-- V0037, the whole table before (older migration targets). At most max_rows (NULL:
-- all) of the events visible in snap, oldest first; returns (count, highest id).
CREATE OR REPLACE FUNCTION switchboard._events_delete_rows(snap pg_snapshot, max_rows integer,
                                                          OUT n integer, OUT max_id bigint)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF switchboard._events_partitioned() THEN
        WITH gone AS (
            DELETE FROM switchboard.events_default e
             WHERE e.id = ANY (ARRAY(SELECT b.id FROM switchboard.events_default b
                                      WHERE b.xid < pg_snapshot_xmax(snap) AND pg_visible_in_snapshot(b.xid, snap)
                                      ORDER BY b.xid
                                      LIMIT max_rows))
            RETURNING e.id
        )
        SELECT count(*), max(g.id) INTO n, max_id FROM gone g;
    ELSE
        -- The batch: events_xid's range below the snapshot's xmax, oldest first;
        -- deleted through the primary key (id = ANY (ARRAY(...))). A join with the
        -- batch instead is planned as a hash join over a sequential scan of all
        -- of events: every batch would read the whole backlog again.
        WITH gone AS (
            DELETE FROM switchboard.events e
             WHERE e.id = ANY (ARRAY(SELECT b.id FROM switchboard.events b
                                      WHERE b.xid < pg_snapshot_xmax(snap) AND pg_visible_in_snapshot(b.xid, snap)
                                      ORDER BY b.xid
                                      LIMIT max_rows))
            RETURNING e.id
        )
        SELECT count(*), max(g.id) INTO n, max_id FROM gone g;
    END IF;
END
$$;
REVOKE ALL ON FUNCTION switchboard._events_delete_rows(pg_snapshot, integer) FROM PUBLIC;

-- reap_events ticks when no relay does (V0026). Retention counts from the tick
-- that covered an event, so with no relay ticking (every replica down, or a
-- database used from psql alone) nothing committed since the last tick was ever
-- covered, and no call deleted it, whatever keep said. Now a call ticks itself,
-- with event_tick() (the relays' own function: the same ticker row, the same
-- snapshot rule, so a reaper's tick is an ordinary tick), when no tick was taken
-- since the previous call (event_horizon.reap_seen_tick, the newest tick that call
-- saw). Relays that run tick every batch within milliseconds of its COMMIT, so a
-- reaper does not take the ticker row from them (while a caller holds it, relays
-- get -1 and wait) except in the moment between a first COMMIT after a quiet spell
-- and their tick; event_tick()'s read-only check takes no lock when nothing is new.
-- It ticks only as the first write of a READ COMMITTED transaction: event_tick()
-- refuses a transaction with an xid (that xid could count as committed in the
-- snapshot, so events it wrote later would be dated before their COMMIT), and the
-- snapshot must be taken after the ticker lock. -1 (another ticker is ticking right
-- now) is left to that ticker. Returns event_tick()'s answer, NULL if it did not ask.
CREATE OR REPLACE FUNCTION switchboard._reap_tick()
RETURNS bigint
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF pg_current_xact_id_if_assigned() IS NOT NULL
       OR current_setting('transaction_isolation') <> 'read committed'
       OR (SELECT max(k.tick) FROM switchboard.event_ticks k)
          > (SELECT h.reap_seen_tick FROM switchboard.event_horizon h) THEN
        RETURN NULL;
    END IF;
    RETURN switchboard.event_tick();
END
$$;
REVOKE ALL ON FUNCTION switchboard._reap_tick() FROM PUBLIC;

-- Retention counts from when an event became visible (its tick), not from its
-- insert: an event whose transaction stayed open longer than the window is
-- still kept for a full window after it commits. The cut is the newest tick
-- older than keep: every event visible in its snapshot goes, older ticks go,
-- the cut itself stays as the first batch boundary (event_window().first_tick).
-- The tick (_reap_tick) comes first, before this transaction writes anything.
CREATE OR REPLACE FUNCTION switchboard.reap_events(keep interval DEFAULT '5 minutes')
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer := 0;
    v_max bigint;
    v_cut bigint;
    v_snap pg_snapshot;
BEGIN
    IF keep IS NULL OR keep < interval '0' THEN
        RAISE EXCEPTION 'invalid keep interval "%"', keep USING ERRCODE = '22023',
            HINT = 'keep is the resume window, e.g. ''5 minutes''.';
    END IF;
    PERFORM switchboard._reap_tick();
    SELECT k.tick, k.snap INTO v_cut, v_snap
      FROM switchboard.event_ticks k WHERE k.created_at < now() - keep ORDER BY k.tick DESC LIMIT 1;
    IF v_cut IS NOT NULL AND v_cut > (SELECT h.reaped_tick FROM switchboard.event_horizon h) THEN
        -- Row by row only where no partition can go (events_default; the whole table
        -- before V0037).
        SELECT d.n, d.max_id INTO v_n, v_max FROM switchboard._events_delete_rows(v_snap, NULL) d;
        DELETE FROM switchboard.event_ticks k WHERE k.tick < v_cut;
        UPDATE switchboard.event_horizon
           SET reaped_tick = v_cut, reaped_through = greatest(reaped_through, coalesce(v_max, 0));
    END IF;
    UPDATE switchboard.event_horizon
       SET reap_seen_tick = coalesce((SELECT max(k.tick) FROM switchboard.event_ticks k), reap_seen_tick);
    -- Ephemeral rows are only read within 30 s of their NOTIFY.
    DELETE FROM switchboard.ephemeral_events x WHERE x.created_at < now() - interval '1 minute';
    -- Last (V0037): whole partitions, then the partitions ahead. A drop holds its
    -- ACCESS EXCLUSIVE lock on events until the caller's transaction ends.
    v_n := v_n + switchboard._events_drop_partitions(
        (SELECT k.snap FROM switchboard.event_ticks k
          WHERE k.tick = (SELECT h.reaped_tick FROM switchboard.event_horizon h)));
    PERFORM switchboard.events_partitions_ensure(keep);
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.reap_events(interval) IS
    'Remove the events that became visible more than keep ago (default 5 minutes) and the ticks before them, in one transaction however many (the 0.2.0 server''s sweep calls this form; see reap_events(keep, max_rows)); advance event_window(); drop ephemeral events older than a minute. Returns how many events. Since V0037 events go a partition at a time: a partition of events is detached (and dropped by the next call) once its id range is given out and every row of it is visible in the cut''s snapshot (rows that no partition covered, in events_default, are deleted one by one), so an event may stay longer than keep, about two keep windows at a steady rate; then it makes sure partitions lie ahead (events_partitions_ensure). Retention counts from the tick that covered an event, never from its insert, so an event is kept at least keep after its COMMIT however long its transaction stayed open, and the first call that starts more than keep after that tick deletes it. When no tick was taken since the previous call (no relay is ticking: every replica down, or a database used from psql alone), the call takes one itself (event_tick()) before it reaps, so every event committed before such a call is deleted by the first call that starts more than keep after it. It ticks only as the first write of a READ COMMITTED transaction and not while another ticker holds the ticker row (-1), and a call that ticked holds that row until its transaction ends: call it in a transaction of its own, as maintenance() does.';
REVOKE ALL ON FUNCTION switchboard.reap_events(interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_events(interval) TO switchboard_app;

-- The bounded reaper (V0015): at most max_rows events per call and
-- transaction, so a 1,000,000-row backlog is 100 short transactions instead of
-- one that holds every row lock, writes a burst of WAL and keeps a snapshot
-- that stops vacuum everywhere. Completeness during a partial reap: the
-- horizon moves first. reaped_tick jumps to the cut before any event of it is
-- deleted, so every position at or below the cut already gets resume_gap while
-- its events are still going; the leftover (events visible in the snapshot of
-- tick reaped_tick) is deleted by this and the following calls. reaped_through
-- (the bare-id horizon of event_window()) is the highest id actually deleted:
-- whatever order the batches take, no event above it is gone.
-- The move and the first batch are one transaction, so once a cut that held
-- events is committed, reaped_through is above 0 (resume.py: after=0 gets
-- resume_gap iff an event was reaped). Snapshots only grow with ticks, so a
-- later cut's snapshot covers any leftover of an earlier one. The event_horizon
-- row lock serialises reapers (reap_events(interval) updates that row too). The
-- tick (_reap_tick) comes first, before that lock: a row lock gives the
-- transaction an xid.
CREATE OR REPLACE FUNCTION switchboard.reap_events(keep interval, max_rows integer)
RETURNS integer
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_n integer := 0;
    v_max bigint;
    v_cut bigint;
    v_snap pg_snapshot;
    v_reaped bigint;
BEGIN
    IF keep IS NULL OR keep < interval '0' THEN
        RAISE EXCEPTION 'invalid keep interval "%"', keep USING ERRCODE = '22023',
            HINT = 'keep is the resume window, e.g. ''5 minutes''.';
    END IF;
    IF max_rows IS NULL OR max_rows NOT BETWEEN 1 AND 1000000 THEN
        RAISE EXCEPTION 'invalid max_rows %', max_rows USING ERRCODE = '22023',
            HINT = 'max_rows bounds one call''s transaction, 1 to 1000000 (e.g. 10000); call again while it returns max_rows.';
    END IF;
    PERFORM switchboard._reap_tick();
    SELECT h.reaped_tick INTO v_reaped FROM switchboard.event_horizon h FOR UPDATE;
    SELECT k.tick INTO v_cut
      FROM switchboard.event_ticks k WHERE k.created_at < now() - keep ORDER BY k.tick DESC LIMIT 1;
    IF v_cut IS NOT NULL AND v_cut > v_reaped THEN
        DELETE FROM switchboard.event_ticks k WHERE k.tick < v_cut;
        UPDATE switchboard.event_horizon SET reaped_tick = v_cut;
        v_reaped := v_cut;
    END IF;
    UPDATE switchboard.event_horizon
       SET reap_seen_tick = coalesce((SELECT max(k.tick) FROM switchboard.event_ticks k), reap_seen_tick);
    SELECT k.snap INTO v_snap FROM switchboard.event_ticks k WHERE k.tick = v_reaped;
    IF v_snap IS NOT NULL THEN
        -- Row by row (at most max_rows) only where no partition can go: events_default
        -- since V0037, the whole table before.
        SELECT d.n, d.max_id INTO v_n, v_max FROM switchboard._events_delete_rows(v_snap, max_rows) d;
        IF v_n > 0 THEN
            UPDATE switchboard.event_horizon SET reaped_through = greatest(reaped_through, v_max);
        END IF;
    END IF;
    -- Ephemeral rows are only read within 30 s of their NOTIFY.
    DELETE FROM switchboard.ephemeral_events x WHERE x.created_at < now() - interval '1 minute';
    -- Last (V0037): whole partitions whose every row is reapable (one DROP whatever
    -- their size: max_rows bounds the row deletes only), then the partitions ahead.
    -- A drop holds its ACCESS EXCLUSIVE lock on events until the caller's transaction
    -- ends: maintenance() runs the rest of its sweep after it.
    v_n := v_n + switchboard._events_drop_partitions(v_snap);
    PERFORM switchboard.events_partitions_ensure(keep);
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION switchboard.reap_events(interval, integer) IS
    'reap_events(keep) in bounded batches (what maintenance(max_rows, ...) calls): detach every partition of events whose id range is given out and whose every row is visible in the cut''s snapshot (the next call drops it; one DETACH however many rows: the count may exceed max_rows), and delete at most max_rows of the events in events_default that became visible more than keep ago, oldest first, in one short transaction; call again while it returns max_rows or more. Returns how many events. The window (event_window().first_tick) moves to the cut before the cut''s events go, so a position inside a partly reaped batch already gets resume_gap. Retention as reap_events(keep): at least keep after an event''s COMMIT, counted from the tick that covered it; the first call that starts more than keep after that tick moves the window past the event and deletes it, or leaves it to the following calls when more than max_rows are due. When no tick was taken since the previous call (no relay is ticking), the call takes one itself (event_tick()) first, so every event committed before such a call is past the window after the first call that starts more than keep after it. It ticks only as the first write of a READ COMMITTED transaction and not while another ticker holds the ticker row (-1), and a call that ticked holds that row until its transaction ends: call it in a transaction of its own, as maintenance() does.';
REVOKE ALL ON FUNCTION switchboard.reap_events(interval, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.reap_events(interval, integer) TO switchboard_app;

-- Client events (typing) are published on the bus, tagged with the sender,
-- never stored in events, and have no id. The sender must belong to the
-- room; the function checks it. The event itself is a row of
-- ephemeral_events read by the relays (the NOTIFY is only its id), so a
-- forged NOTIFY cannot put words in a member's mouth.
CREATE OR REPLACE FUNCTION switchboard.publish_client_event(sender uuid, room text, event text, payload jsonb DEFAULT '{}')
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM switchboard._check_event(event, payload, 4096);
    IF NOT EXISTS (SELECT 1 FROM switchboard.room_members m
                    WHERE m.room = publish_client_event.room AND m.user_id = sender) THEN
        RAISE EXCEPTION 'user % is not a member of room "%"', sender, room USING ERRCODE = '42501',
            HINT = 'Only room members may publish client events to a room.';
    END IF;
    PERFORM switchboard._publish_ephemeral(NULL, room, event, sender, payload);
END
$$;
COMMENT ON FUNCTION switchboard.publish_client_event(uuid, text, text, jsonb) IS
    'Relay an ephemeral client event (e.g. typing) from sender to a room it belongs to: never stored in events, no id, payload up to 4 kB. 42501 if sender is not a member.';
REVOKE ALL ON FUNCTION switchboard.publish_client_event(uuid, text, text, jsonb) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.publish_client_event(uuid, text, text, jsonb) TO switchboard_app;

-- A tool call's registration (tool_call_send): validate, refuse an offline user
-- (NULL), record who the call went to and which replica waits.
CREATE OR REPLACE FUNCTION switchboard._tool_call_register(
    user_id uuid, replica_id text, name text, args jsonb, timeout interval)
RETURNS uuid
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id uuid := gen_random_uuid();
BEGIN
    PERFORM switchboard._check_event(coalesce(name, ''), coalesce(args, 'null'), 6000);
    IF timeout IS NULL OR timeout <= interval '0' OR timeout > interval '10 minutes' THEN
        RAISE EXCEPTION 'invalid timeout "%"', timeout USING ERRCODE = '22023',
            HINT = 'A tool call waits between 1 ms and 10 minutes.';
    END IF;
    IF NOT switchboard.user_online(user_id) THEN
        RETURN NULL;
    END IF;
    INSERT INTO switchboard.tool_calls (id, user_id, replica_id, name, expires_at)
    VALUES (v_id, user_id, replica_id, name, now() + timeout);
    RETURN v_id;
END
$$;
REVOKE ALL ON FUNCTION switchboard._tool_call_register(uuid, text, text, jsonb, interval) FROM PUBLIC;

-- The tool bridge's send and collect, which replaced 0.1's tool_call_start and
-- tool_call_take (dropped by V0026). tool_call_start put the call's name and
-- args in the NOTIFY payload, so anybody could send a browser a forged
-- tool.call; here the call is an ephemeral row read by the relay. And a
-- forged tool_result wake-up made the waiter collect (and delete) an
-- unanswered call: tool_call_collect only takes an answered one.
CREATE OR REPLACE FUNCTION switchboard.tool_call_send(
    user_id uuid, replica_id text, name text, args jsonb DEFAULT '{}', timeout interval DEFAULT '30 seconds')
RETURNS uuid
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id uuid;
BEGIN
    v_id := switchboard._tool_call_register(user_id, replica_id, name, args, timeout);
    IF v_id IS NULL THEN
        RETURN NULL;
    END IF;
    PERFORM switchboard._publish_ephemeral(user_id, NULL, 'tool.call.' || v_id, NULL,
                                           jsonb_build_object('name', name, 'args', args));
    RETURN v_id;
END
$$;
COMMENT ON FUNCTION switchboard.tool_call_send(uuid, text, text, jsonb, interval) IS
    'Send tool.call.<id> to user_id''s sockets wherever they are; returns the call id, or NULL if the user has no socket on any live replica. The answer is collected with tool_call_collect().';
REVOKE ALL ON FUNCTION switchboard.tool_call_send(uuid, text, text, jsonb, interval) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.tool_call_send(uuid, text, text, jsonb, interval) TO switchboard_app;

CREATE OR REPLACE FUNCTION switchboard.tool_call_collect(call_id uuid, give_up boolean DEFAULT false)
RETURNS TABLE (answered boolean, result jsonb)
LANGUAGE plpgsql SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    RETURN QUERY
    DELETE FROM switchboard.tool_calls c
     WHERE c.id = tool_call_collect.call_id AND (c.answered OR give_up)
    RETURNING c.answered, c.result;
END
$$;
COMMENT ON FUNCTION switchboard.tool_call_collect(uuid, boolean) IS
    'The waiting replica collects an answered tool call (no row while unanswered: a wake-up that was not an answer changes nothing). give_up => true forgets the call whatever its state (timeout).';
REVOKE ALL ON FUNCTION switchboard.tool_call_collect(uuid, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.tool_call_collect(uuid, boolean) TO switchboard_app;

-- The HMAC pads of a 32-byte key: the key zero-padded to SHA-256's 64-byte block,
-- XORed with 0x36 (inner) and 0x5c (outer), RFC 2104.
CREATE OR REPLACE FUNCTION switchboard._live_pads(key bytea, OUT ipad bytea, OUT opad bytea)
LANGUAGE plpgsql IMMUTABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_block bytea := key || ('\x' || repeat('00', 64 - octet_length(key)))::bytea;
BEGIN
    ipad := v_block;
    opad := v_block;
    FOR i IN 0..63 LOOP
        ipad := set_byte(ipad, i, get_byte(v_block, i) # 54);
        opad := set_byte(opad, i, get_byte(v_block, i) # 92);
    END LOOP;
END
$$;
REVOKE ALL ON FUNCTION switchboard._live_pads(bytea) FROM PUBLIC;

-- The DBA's switch for the live path. Not granted to anybody: the owner (or a
-- superuser) decides whether event contents may travel on the bus.
--
-- The channel is named after the key (event_live.channel, a generated column), so a
-- rotation also moves the channel: one whose name leaked is dropped by the relays at
-- once (they LISTEN on the current channel only; a message signed with the old key
-- that commits later is lost on the bus, never for delivery: the relay reads
-- everything until the transactions open at its key read have ended; README "The
-- live path"). Every call tells the relays on switchboard_events ({"live":1}): each
-- re-reads the key and LISTENs on the new channel. A forged hint
-- costs a relay one key read per read cycle at most (coalesced), never per message.
--
-- send_id_hints (NULL: unchanged): whether publishers keep sending the {"id": N} hint on
-- switchboard_events while the path is on. Keep it on (the default) while a previous
-- release's replicas run: they do not LISTEN on the live channel and wake on the hint.
-- Off once every replica runs this release: one NOTIFY per transaction fewer, heard by
-- every replica (README "The live path").
DROP FUNCTION IF EXISTS switchboard.event_live_path(boolean, integer, boolean);  -- before id_hints (unreleased)
CREATE OR REPLACE FUNCTION switchboard.event_live_path(enable boolean, message_max_bytes integer DEFAULT NULL,
                                                       rotate_key boolean DEFAULT false,
                                                       send_id_hints boolean DEFAULT NULL)
RETURNS TABLE (enabled boolean, max_bytes integer, key_created_at timestamptz, id_hints boolean)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_key bytea;
    v_pads record;
BEGIN
    IF enable IS NULL THEN
        RAISE EXCEPTION 'enable must be true or false, not NULL' USING ERRCODE = '22004',
            HINT = 'SELECT * FROM switchboard.event_live_path(true) turns the live path on; false turns it off.';
    END IF;
    IF message_max_bytes IS NOT NULL AND message_max_bytes NOT BETWEEN 0 AND 7900 THEN
        RAISE EXCEPTION 'invalid message_max_bytes %', message_max_bytes USING ERRCODE = '22023',
            HINT = 'The largest live message in bytes, 0 to 7900 (a NOTIFY payload is below 8000 bytes); an event above it is read, not sent.';
    END IF;
    IF rotate_key IS NULL THEN
        RAISE EXCEPTION 'rotate_key must be true or false, not NULL' USING ERRCODE = '22004';
    END IF;
    SELECT l.key INTO v_key FROM switchboard.event_live l WHERE l.singleton FOR UPDATE;
    IF rotate_key THEN
        v_key := decode(replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''), 'hex');
    END IF;
    v_pads := switchboard._live_pads(v_key);
    UPDATE switchboard.event_live l
       SET enabled = event_live_path.enable,
           max_bytes = coalesce(event_live_path.message_max_bytes, l.max_bytes),
           key = v_key, ipad = v_pads.ipad, opad = v_pads.opad,
           key_created_at = CASE WHEN rotate_key THEN now() ELSE l.key_created_at END,
           id_hints = coalesce(event_live_path.send_id_hints, l.id_hints)
     WHERE l.singleton;
    -- A relay re-reads the key after a reconnect, on this hint and at each idle check
    -- (never because a message does not verify: anybody who knows the channel can send
    -- those). An event sent on a channel it does not LISTEN on yet is read like any
    -- event, never lost.
    PERFORM pg_notify('switchboard_events', '{"live":1}');
    RETURN QUERY SELECT l.enabled, l.max_bytes, l.key_created_at, l.id_hints
                   FROM switchboard.event_live l WHERE l.singleton;
END
$$;
COMMENT ON FUNCTION switchboard.event_live_path(boolean, integer, boolean, boolean) IS
    'Switch the verified live path on or off (off by default): publishers also NOTIFY each event (up to max_bytes) signed with HMAC-SHA256 on the key''s channel (event_live.channel: switchboard_live_ and 32 hex digits, as secret as the key), and relays deliver it without reading first. Any role that can name the channel can LISTEN to event contents: the owner, switchboard_app (relay_live_key()), superusers. rotate_key draws a new key and with it a new channel. Every call NOTIFYs {"live":1} on switchboard_events so relays re-read the key. send_id_hints false stops the {"id": N} hints on switchboard_events while the path is on (only once no previous-release replica runs).';
REVOKE ALL ON FUNCTION switchboard.event_live_path(boolean, integer, boolean, boolean) FROM PUBLIC;

-- Returns the channel with the key, in one snapshot: a relay never LISTENs on one
-- key's channel while verifying with another.
CREATE OR REPLACE FUNCTION switchboard.relay_live_key(OUT key bytea, OUT channel text)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    SELECT l.key, l.channel INTO key, channel FROM switchboard.event_live l WHERE l.singleton AND l.enabled;
END
$$;
COMMENT ON FUNCTION switchboard.relay_live_key() IS
    'Internal (relay): the key that signs live messages and the channel they are sent on (switchboard_live_ and 32 hex digits), both NULL while the live path is off. Keep both secret: whoever can name the channel can LISTEN to every event.';
REVOKE ALL ON FUNCTION switchboard.relay_live_key() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.relay_live_key() TO switchboard_app;

-- LISTEN (or UNLISTEN) on a live channel from inside a function. LISTEN needs no
-- privilege, so this is no SECURITY DEFINER: it exists so the channel's name travels
-- as a bound parameter and never appears in the session's query text, which
-- pg_stat_activity shows to pg_read_all_stats (and pg_stat_statements, with
-- pg_stat_statements.track = all, would record the nested LISTEN: README "The live
-- path"). Takes effect when the calling transaction commits, like LISTEN.
CREATE OR REPLACE FUNCTION switchboard.relay_live_listen(channel text, listening boolean DEFAULT true)
RETURNS void
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF channel IS NULL OR channel !~ '^switchboard_live_[0-9a-f]{32}$' THEN
        RAISE EXCEPTION 'invalid live channel "%"', left(channel, 100) USING ERRCODE = '22023',
            HINT = 'A live channel is switchboard_live_ and 32 lowercase hex digits, as relay_live_key() returns it.';
    END IF;
    IF listening IS NULL THEN
        RAISE EXCEPTION 'listening must be true or false, not NULL' USING ERRCODE = '22004',
            HINT = 'true LISTENs on the channel, false UNLISTENs.';
    END IF;
    EXECUTE format(CASE WHEN listening THEN 'LISTEN %I' ELSE 'UNLISTEN %I' END, channel);
END
$$;
COMMENT ON FUNCTION switchboard.relay_live_listen(text, boolean) IS
    'Internal (relay): LISTEN on a live channel (listening false: UNLISTEN), at the calling transaction''s commit. The name is an argument so it stays out of the session''s query text (pg_stat_activity). SQLSTATE 22023 for anything but switchboard_live_ and 32 hex digits.';
REVOKE ALL ON FUNCTION switchboard.relay_live_listen(text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.relay_live_listen(text, boolean) TO switchboard_app;
