-- V0028: least-privilege roles for the application's own code and for people
-- (issue 33): switchboard_publisher (notify, enqueue, a stream's producer side),
-- switchboard_reader (status, metrics, the runs / handlers / replicas views) and
-- switchboard_operator (retry, cancel, pause, resume, stop a stream; a member of
-- switchboard_reader). switchboard_app keeps every grant the replicas need.
--
-- The roles and their grants are in db/functions/95_roles.sql (applied by
-- afterAll, at every migration target): the roles are created there when missing,
-- so the grants never name a role that does not exist yet. No table changes.
SELECT 1;
