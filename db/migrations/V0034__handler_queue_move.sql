-- V0034: a handler that moves to another queue takes its queued runs along (issue 33's
-- follow-up; V0032 and V0033 were left to work in progress on other branches).
--
-- set_handler_options() (22_queues.sql) now moves the handler's queued runs that sit
-- in its previous queue (the default queue before its first registration) to the new
-- one, in the same transaction as the new row. Before, a deployment that changed a
-- handler's queue left its backlog in a queue that no handler named, which no replica
-- serves: those runs waited forever. Runs enqueued into a queue the caller chose stay.
-- No schema change: this version carries the function change (applied by afterAll).
SELECT 1;
