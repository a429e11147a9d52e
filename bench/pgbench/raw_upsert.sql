-- The physical limit of rate_check: the same one-row-per-key upsert on an UNLOGGED
-- table, no function, no validation, no GCRA arithmetic.
\set k random(1, 10000)
INSERT INTO bench_raw AS r (key, tat)
VALUES ('k' || :k, (extract(epoch FROM now()) * 1000000)::bigint + 1000)
ON CONFLICT (key) DO UPDATE SET tat = greatest(r.tat, (extract(epoch FROM now()) * 1000000)::bigint) + 1000
RETURNING tat;
