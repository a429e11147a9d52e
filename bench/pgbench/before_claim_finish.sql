-- claim_finish.sql against the functions of an earlier commit (bench/sql.py --before REV),
-- installed beside the current ones as public.bench_before_*.
SELECT id AS run_id FROM bench_before_claim_due_task('w' || :client_id) \gset
SELECT bench_before_finish_run(:run_id, 'w' || :client_id, true);
