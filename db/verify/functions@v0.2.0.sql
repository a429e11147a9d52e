-- Frozen by scripts/stamp_functions.py: db/functions/*.sql as released in v0.2.0.
-- Never edit: deployed databases recorded this script.
-- Superseded: once deployed, a later release's `functions` change (a sqitch
-- rework) replaces this set, and `sqitch verify` runs every deployed change's
-- verify against today's database. The newest verify/functions.sql checks the
-- current set exactly; this one only checks that the functions are there.
BEGIN;
DO $verify$
BEGIN
    IF (EXISTS (SELECT 1 FROM pg_catalog.pg_proc WHERE pronamespace = 'switchboard'::regnamespace)) IS NOT TRUE THEN
        RAISE EXCEPTION 'switchboard verify: expected functions in schema switchboard' USING ERRCODE = 'P0004';
    END IF;
END
$verify$;
ROLLBACK;
