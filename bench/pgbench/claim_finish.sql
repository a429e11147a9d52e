-- One worker cycle: claim the oldest due job, finish it.
SELECT id AS run_id FROM switchboard.claim_due_task('w' || :client_id) \gset
SELECT switchboard.finish_run(:run_id, 'w' || :client_id, true);
