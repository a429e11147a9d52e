-- pgTAP: V0022 streams. Signatures, privileges, errors (SQLSTATE each), the chunk
-- order, the group append's per-stream report, stop, close, the bounded reaper.
-- One transaction, rolled back.
\set ON_ERROR_STOP 1
\set QUIET 1
\pset format unaligned
\pset tuples_only true
\pset pager off
BEGIN;
CREATE EXTENSION IF NOT EXISTS pgtap;
SELECT plan(44);

-- The API and who may call it.
SELECT has_function('switchboard', 'stream_open', ARRAY['uuid', 'text', 'jsonb', 'text', 'interval', 'interval']);
SELECT has_function('switchboard', 'stream_append', ARRAY['uuid', 'text[]']);
SELECT has_function('switchboard', 'stream_append_many', ARRAY['uuid[]', 'text[]']);
SELECT has_function('switchboard', 'stream_renew', ARRAY['uuid[]']);
SELECT has_function('switchboard', 'stream_close', ARRAY['uuid', 'text', 'jsonb']);
SELECT has_function('switchboard', 'stream_stop', ARRAY['uuid', 'uuid']);
SELECT has_function('switchboard', 'stream_read', ARRAY['uuid', 'integer', 'integer', 'uuid']);
SELECT has_function('switchboard', 'stream_read_many', ARRAY['uuid[]', 'integer[]', 'integer']);
SELECT has_function('switchboard', 'stream_info', ARRAY['uuid', 'uuid']);
SELECT has_function('switchboard', 'streams_of', ARRAY['uuid']);
SELECT has_function('switchboard', 'reap_streams', ARRAY['integer']);
SELECT function_privs_are('switchboard', 'stream_open', ARRAY['uuid', 'text', 'jsonb', 'text', 'interval', 'interval'],
                          'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'stream_append_many', ARRAY['uuid[]', 'text[]'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'stream_stop', ARRAY['uuid', 'uuid'], 'switchboard_app', ARRAY['EXECUTE']);
SELECT function_privs_are('switchboard', 'stream_append', ARRAY['uuid', 'text[]'], 'switchboard_job', ARRAY[]::text[],
                          'the sql-task role cannot write streams');
SELECT function_privs_are('switchboard', 'stream_read', ARRAY['uuid', 'integer', 'integer', 'uuid'], 'public', ARRAY[]::text[],
                          'PUBLIC cannot read streams');
SELECT table_privs_are('switchboard', 'stream_chunks', 'switchboard_app', ARRAY['SELECT'],
                       'the app role reads chunks; only the functions write them');
SELECT hasnt_fk('switchboard', 'stream_chunks', 'no foreign key on the hottest insert');

-- A stream, its chunks in order.
SELECT switchboard.create_user('pgtap-streamer', '$argon2id$v=19$m=65536,t=3,p=4$c2FsdA$aGFzaA') AS u \gset
SELECT switchboard.create_user('pgtap-stranger', '$argon2id$v=19$m=65536,t=3,p=4$c2FsdA$aGFzaA') AS x \gset
SELECT switchboard.stream_open(:'u', 'completion') AS s \gset
SELECT switchboard.stream_open(:'u', 'completion') AS s2 \gset
SELECT is(switchboard.stream_append(:'s', ARRAY['a', 'b']), 2, 'stream_append returns the last seq');
SELECT results_eq(
    format($$SELECT stream_id, last_seq, status, accepted FROM switchboard.stream_append_many(ARRAY[%L, %L, %L]::uuid[], ARRAY['c', 'x', 'd'])$$, :'s', :'s2', :'s'),
    format($$SELECT * FROM (VALUES (%L::uuid, 4, 'open', 2), (%L::uuid, 1, 'open', 1)) v ORDER BY 1$$, :'s', :'s2'),
    'the group append numbers each stream''s chunks on from its last seq, in array order');
SELECT results_eq(format($$SELECT seq, data FROM switchboard.stream_read(%L)$$, :'s'),
                  $$VALUES (1, 'a'), (2, 'b'), (3, 'c'), (4, 'd')$$, 'stream_read returns the chunks in seq order');
SELECT results_eq(format($$SELECT seq, data FROM switchboard.stream_read(%L, 2, 1)$$, :'s'),
                  $$VALUES (3, 'c')$$, 'after_seq and max_rows');
SELECT is((SELECT chunks FROM switchboard.stream_read_many(ARRAY[:'s']::uuid[], ARRAY[1])),
          ARRAY['b', 'c', 'd'], 'stream_read_many: one row per stream, its chunks after the seq in order');

-- Errors: a SQLSTATE each.
SELECT throws_ok(format($$SELECT switchboard.stream_append(%L, ARRAY[NULL::text])$$, :'s'), '22004', NULL, 'a NULL chunk');
SELECT throws_ok(format($$SELECT switchboard.stream_append(%L, ARRAY[repeat('x', 65537)])$$, :'s'), '54000', NULL, 'a chunk over 64 KiB');
SELECT throws_ok(format($$SELECT switchboard.stream_append(%L, array_fill('x'::text, ARRAY[10001]))$$, :'s'), '54000', NULL,
                 'more than 10000 chunks in one call');
SELECT throws_ok($$SELECT switchboard.stream_append(gen_random_uuid(), ARRAY['x'])$$, 'P0002', NULL, 'an unknown stream');
SELECT throws_ok(format($$SELECT * FROM switchboard.stream_read(%L, 0, 10, %L)$$, :'s', :'x'), 'P0002', NULL,
                 'a stream the reader may not see reads as unknown');
SELECT throws_ok(format($$SELECT switchboard.stream_open(%L, 'no spaces allowed')$$, :'u'), '22023', NULL, 'a bad kind');
SELECT throws_ok(format($$SELECT * FROM switchboard.stream_append_many(ARRAY[%L]::uuid[], ARRAY['a', 'b'])$$, :'s'), '22023', NULL,
                 'arrays of different lengths');
SELECT throws_ok(format($$SELECT switchboard.stream_stop(%L, %L)$$, :'s', :'x'), 'P0002', NULL, 'only the owner or an admin stops');

-- Stop, close, the one durable end event.
SELECT is(switchboard.stream_stop(:'s2'), 'stopped', 'stream_stop stops an open stream');
SELECT is(switchboard.stream_stop(:'s2'), 'stopped', '... and is idempotent');
SELECT throws_ok(format($$SELECT switchboard.stream_append(%L, ARRAY['late'])$$, :'s2'), '55000', NULL,
                 'a stopped stream takes no chunk');
SELECT is((SELECT status FROM switchboard.stream_append_many(ARRAY[:'s2']::uuid[], ARRAY['late'])), 'stopped',
          'the group append reports it instead of failing the batch');
SELECT ok(switchboard.stream_close(:'s2', 'stopped', '{"text": "x"}') > 0, 'the producer closes a stopped stream with its final');
SELECT ok(switchboard.stream_close(:'s', 'done', '{"text": "abcd"}') > 0, 'stream_close returns the end event''s id');
SELECT is((SELECT payload FROM switchboard.events WHERE event = 'stream.end' AND payload->>'stream' = :'s'),
          jsonb_build_object('stream', :'s'::uuid, 'kind', 'completion', 'status', 'done', 'last_seq', 4,
                             'final', '{"text": "abcd"}'::jsonb), 'the end event carries status, last_seq and final');
SELECT throws_ok(format($$SELECT switchboard.stream_close(%L)$$, :'s'), '55000', NULL, 'a stream closes once');
SELECT is((SELECT count(*) FROM switchboard.streams_of(:'u')), 0::bigint, 'streams_of lists open streams only');

-- A producer that stopped renewing ends as error; retention deletes in bounded batches.
SELECT switchboard.stream_open(:'u', 'completion', lease => '1 second') AS s3 \gset
UPDATE switchboard.streams SET lease_until = now() - interval '1 second' WHERE id = :'s3';
SELECT is(switchboard.reap_streams(1000), 0, 'nothing to delete yet');
SELECT is((SELECT status FROM switchboard.streams WHERE id = :'s3'), 'error', 'the expired lease ended it as error');
UPDATE switchboard.streams SET closed_at = now() - interval '1 hour' WHERE id = :'s';
SELECT is(switchboard.reap_streams(3), 3, 'reap_streams deletes at most max_rows chunks');
SELECT is(switchboard.reap_streams(3), 2, '... then the last chunk and the row');

SELECT * FROM finish();
ROLLBACK;
