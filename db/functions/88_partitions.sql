-- The partition layout for DBAs (issue 35, item 5).
--
-- Two tables are partitioned: switchboard.task_runs_history by finish time (a
-- day per partition, V0036) and switchboard.events by id (V0037). Each has a
-- DEFAULT partition as a safety net: a finish or a publish never fails because
-- maintenance has not created the partition it needs yet; rows in a DEFAULT are
-- the sign that it has not. Both read the catalog only (and a bounded peek into
-- the DEFAULT partitions), so they work at any migration target: before V0036
-- and V0037 they return no rows.

-- Every partition of the two partitioned tables, oldest range first, DEFAULT last.
CREATE OR REPLACE VIEW switchboard.partitions AS
SELECT p.relname::text                                  AS parent,
       c.relname::text                                  AS partition,
       c.relpartbound IS NOT NULL AND pg_catalog.pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT' AS is_default,
       btrim(substring(pg_catalog.pg_get_expr(c.relpartbound, c.oid) FROM '^FOR VALUES FROM \((.*)\) TO \(.*\)$'), '''') AS range_from,
       btrim(substring(pg_catalog.pg_get_expr(c.relpartbound, c.oid) FROM '^FOR VALUES FROM \(.*\) TO \((.*)\)$'), '''') AS range_to,
       greatest(c.reltuples, 0)::bigint                 AS estimated_rows,
       pg_catalog.pg_total_relation_size(c.oid)         AS total_bytes,
       pg_catalog.obj_description(c.oid, 'pg_class')    AS comment
  FROM pg_catalog.pg_inherits i
  JOIN pg_catalog.pg_class c ON c.oid = i.inhrelid
  JOIN pg_catalog.pg_class p ON p.oid = i.inhparent
  JOIN pg_catalog.pg_namespace n ON n.oid = p.relnamespace
 WHERE n.nspname = 'switchboard'
   AND p.relname IN ('task_runs_history', 'events')
   AND c.relkind IN ('r', 'p')
 ORDER BY p.relname, pg_catalog.pg_get_expr(c.relpartbound, c.oid) = 'DEFAULT', c.relname;
COMMENT ON VIEW switchboard.partitions IS
    'Every partition of switchboard.task_runs_history (a UTC day of finish times each) and switchboard.events (a range of ids each): its range as PostgreSQL prints it (range_from, range_to; MINVALUE for the open lower end), whether it is the DEFAULT (the safety net; it should stay empty), the planner''s row estimate and its size on disk with indexes. Maintenance creates partitions ahead and drops whole ones past retention; see partition_health() for the same as figures.';
COMMENT ON COLUMN switchboard.partitions.parent IS
    'The partitioned table: task_runs_history or events.';
COMMENT ON COLUMN switchboard.partitions.partition IS
    'The partition (a table of its own in schema switchboard).';
COMMENT ON COLUMN switchboard.partitions.is_default IS
    'The DEFAULT partition: rows no other partition takes land here; it stays empty while maintenance keeps partitions ahead.';
COMMENT ON COLUMN switchboard.partitions.range_from IS
    'Lower bound of the range, included (a timestamptz for task_runs_history, an id for events; MINVALUE when open). NULL for the DEFAULT.';
COMMENT ON COLUMN switchboard.partitions.range_to IS
    'Upper bound of the range, excluded. NULL for the DEFAULT.';
COMMENT ON COLUMN switchboard.partitions.estimated_rows IS
    'The planner''s row estimate (pg_class.reltuples, as of the last ANALYZE or VACUUM; 0 before one).';
COMMENT ON COLUMN switchboard.partitions.total_bytes IS
    'Size on disk with indexes and TOAST (pg_total_relation_size).';
COMMENT ON COLUMN switchboard.partitions.comment IS
    'The partition''s COMMENT.';
REVOKE ALL ON switchboard.partitions FROM PUBLIC;
GRANT SELECT ON switchboard.partitions TO switchboard_app;

-- The partition layout as figures, for a DBA in psql (the replicas' gauges and
-- alerts read status() and metrics_snapshot()). Cheap: catalog rows, one sequence read, and
-- at most 10,001 rows of each DEFAULT partition.
--   run_partitions_ahead_seconds   how far ahead of now() the newest day of
--                                  task_runs_history reaches (about 3-4 days)
--   run_history_default_rows       finished runs in its DEFAULT (0; capped 10001)
--   run_history_oldest_seconds     how long ago the oldest day partition ended
--                                  (below the 7-day retention plus a sweep)
--   event_partitions_ahead_ids     ids left before event_id_seq passes the
--                                  newest events partition
--   events_default_rows            events in its DEFAULT (0; capped 10001)
CREATE OR REPLACE FUNCTION switchboard.partition_health()
RETURNS TABLE (item text, value double precision)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_newest text;
    v_oldest text;
    v_n bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM pg_partitioned_table pt
                WHERE pt.partrelid = to_regclass('switchboard.task_runs_history')) THEN
        SELECT max(p.range_to::timestamptz)::text, min(p.range_to::timestamptz)::text
          INTO v_newest, v_oldest
          FROM switchboard.partitions p
         WHERE p.parent = 'task_runs_history' AND NOT p.is_default AND p.range_to <> 'MAXVALUE';
        item := 'run_partitions_ahead_seconds';
        value := coalesce(extract(epoch FROM v_newest::timestamptz - now()), 0);
        RETURN NEXT;
        item := 'run_history_oldest_seconds';
        value := greatest(coalesce(extract(epoch FROM now() - v_oldest::timestamptz), 0), 0);
        RETURN NEXT;
        IF to_regclass('switchboard.task_runs_history_default') IS NOT NULL THEN
            EXECUTE 'SELECT count(*) FROM (SELECT 1 FROM switchboard.task_runs_history_default LIMIT 10001) d'
               INTO v_n;
            item := 'run_history_default_rows';
            value := v_n;
            RETURN NEXT;
        END IF;
    END IF;
    IF EXISTS (SELECT 1 FROM pg_partitioned_table pt
                WHERE pt.partrelid = to_regclass('switchboard.events')) THEN
        SELECT max(p.range_to::bigint)::text INTO v_newest
          FROM switchboard.partitions p
         WHERE p.parent = 'events' AND NOT p.is_default AND p.range_to <> 'MAXVALUE';
        item := 'event_partitions_ahead_ids';
        value := coalesce(v_newest::bigint, 0)
                 - (SELECT CASE WHEN s.is_called THEN s.last_value + 1 ELSE s.last_value END
                      FROM switchboard.event_id_seq s);
        RETURN NEXT;
        IF to_regclass('switchboard.events_default') IS NOT NULL THEN
            EXECUTE 'SELECT count(*) FROM (SELECT 1 FROM switchboard.events_default LIMIT 10001) d' INTO v_n;
            item := 'events_default_rows';
            value := v_n;
            RETURN NEXT;
        END IF;
    END IF;
END
$$;
COMMENT ON FUNCTION switchboard.partition_health() IS
    'The partition layout as figures for a DBA: run_partitions_ahead_seconds (how far past now() the newest day partition of task_runs_history reaches; maintenance keeps it 3 to 4 days), run_history_oldest_seconds (how long ago the oldest day partition ended; retention drops it once older than 7 days), run_history_default_rows and events_default_rows (rows in the DEFAULT partitions, which stay empty while maintenance keeps ahead; capped at 10001), event_partitions_ahead_ids (ids left before event_id_seq passes the newest events partition). No rows for a table that is not partitioned (a database before V0036 / V0037).';
REVOKE ALL ON FUNCTION switchboard.partition_health() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION switchboard.partition_health() TO switchboard_app;
