-- Baseline for a ticket pair, also one statement: bench_ticket_pair (a PL/pgSQL
-- function created by bench/sql.py) inserts sha256(raw) into an UNLOGGED table of the
-- same shape and deletes it again. The two writes and the hashing, nothing else: no
-- validation, no user lookup, no expiry check.
SELECT bench_ticket_pair(:uid, uuid_send(gen_random_uuid()));
