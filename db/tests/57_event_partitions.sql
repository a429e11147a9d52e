-- pgTAP: V0037. events is partitioned by id with a DEFAULT partition;
-- events_partitions_ensure() keeps partitions ahead of event_id_seq, contiguous;
-- an id no partition covers lands in events_default. Inside a rolled-back
-- transaction (the partitions it creates go with it). Dropping partitions is
-- proven by tests/test_event_partitions.py (it needs committed transactions).
\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
CREATE EXTENSION IF NOT EXISTS pgtap;
SELECT plan(10);

SELECT has_function('switchboard', 'event_partitions', ARRAY[]::text[]);
SELECT has_function('switchboard', 'events_partitions_ensure', ARRAY['interval']);
SELECT function_privs_are('switchboard', 'events_partitions_ensure', ARRAY['interval'], 'switchboard_app',
                          ARRAY[]::text[], 'partition maintenance is the owner''s (reap_events calls it)');
SELECT is((SELECT c.relkind::text FROM pg_class c WHERE c.oid = 'switchboard.events'::regclass), 'p',
          'events is a partitioned table');
SELECT is((SELECT count(*) FROM switchboard.event_partitions() WHERE is_default), 1::bigint,
          'events has a DEFAULT partition');
SELECT switchboard.events_partitions_ensure('5 minutes') AS ignored \gset
SELECT ok((SELECT count(*) FILTER (WHERE from_id > switchboard._event_id_allocated())
             FROM switchboard.event_partitions() WHERE NOT is_default)
          >= (SELECT ahead FROM switchboard.event_partitioning),
          'after a sweep, event_partitioning.ahead partitions lie ahead of event_id_seq');

SELECT max(to_id) AS top, count(*) FILTER (WHERE from_id > switchboard._event_id_allocated()) AS have
  FROM switchboard.event_partitions() WHERE NOT is_default \gset
UPDATE switchboard.event_partitioning SET ahead = :have + 2;
SELECT is(switchboard.events_partitions_ensure('5 minutes'), 2, 'events_partitions_ensure creates what is missing');
SELECT is((SELECT min(from_id) FROM switchboard.event_partitions() WHERE from_id >= :top), :top::bigint,
          'the new partitions continue where the last one ended');
SELECT throws_ok('SELECT switchboard.events_partitions_ensure(NULL)', '22023', NULL,
                 'a NULL keep is refused (22023)');
INSERT INTO switchboard.events (id, room, event) VALUES (9100000000000000000, 'pgtap-part', 'x');
SELECT is((SELECT e.tableoid::regclass::text FROM switchboard.events e WHERE e.id = 9100000000000000000),
          'switchboard.events_default', 'an id no partition covers lands in events_default');

SELECT * FROM finish();
ROLLBACK;
