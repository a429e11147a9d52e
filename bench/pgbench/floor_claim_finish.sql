-- Figure 3a's floor: the baseline's two UPDATEs, each in a SECURITY DEFINER PL/pgSQL
-- function with claim_due_task's SET clauses, on switchboard.task_runs (bench/sql.py
-- FLOOR_DDL). No validation, no lease rescue, no tick, no paused-handler filter.
SELECT id AS run_id FROM bench_claim_tr_set3('w' || :client_id) \gset
SELECT bench_finish_tr_set3(:run_id, 'w' || :client_id, true);
