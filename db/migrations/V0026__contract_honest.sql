-- V0026: the SQL contract honest again (issue 32).
--
-- 1. The 0.1 forms go. The supported upgrade path is one release at a time
--    (0.1 -> 0.2 -> this release), and during a rolling update only the previous
--    release's servers (0.2.0) run beside this one. These functions were kept
--    for 0.1 servers; the 0.2.0 server calls none of them (git show v0.2.0's
--    server/: it calls events_since_v2, relay_read_v2, auth_snapshot_v3,
--    login_lookup_v2, issue_ticket_v2, consume_ticket_v2, tool_call_send,
--    tool_call_collect and the five-argument replica_heartbeat). Some of them
--    also promised what is false since V0009: events_since's COMMENT said
--    "Complete: once id N was seen, no event with id <= N can still commit",
--    but publishers take no lock, so an event whose transaction commits after a
--    higher id was read is never returned by it. The complete resume is
--    events_since_v2 (positions (tick, id), event_window()).
--    Kept, because the 0.2.0 server calls them: relay_read_v2, maintenance(keep_runs,
--    keep_events, rate_limit_idle, replica_stale) and through it the unbounded
--    reap_events(interval), reap_runs(interval), reap_rate_limits(interval);
--    auth_snapshot_v2 stays as the base of auth_snapshot_v3.
--
-- 2. reap_events honours keep with no ticker. Retention counts from the tick
--    that covered an event; with no relay ticking (every replica down, or a
--    database used from psql alone) nothing was covered, so nothing was ever
--    reaped. Both overloads now tick themselves, with event_tick(), when no tick
--    was taken since the previous call: event_horizon.reap_seen_tick (new) is the
--    newest tick the last call saw. It starts at the newest tick now, so the
--    first call after this migration ticks unless a relay ticked meanwhile.
--    maintenance() calls reap_events first in its sweep (a tick must be the
--    transaction's first write).
--
-- Function changes (applied by afterAll): the drops below; reap_events (both),
-- _reap_tick (new), maintenance (both: reap_events first); COMMENTs of
-- relay_read_v2, auth_snapshot_v2, login_lookup_v2, maintenance, reap_events.
DROP FUNCTION IF EXISTS switchboard.events_since(uuid, bigint, text[], integer);
DROP FUNCTION IF EXISTS switchboard.event_horizon();
DROP FUNCTION IF EXISTS switchboard.event_head();
DROP FUNCTION IF EXISTS switchboard.relay_read(bigint, bigint[], integer);
DROP FUNCTION IF EXISTS switchboard._relay_fetch_event(bigint);
DROP FUNCTION IF EXISTS switchboard.issue_ticket(uuid, interval);
DROP FUNCTION IF EXISTS switchboard.consume_ticket(text);
DROP FUNCTION IF EXISTS switchboard.login_lookup(text);
DROP FUNCTION IF EXISTS switchboard.auth_snapshot(interval);
DROP FUNCTION IF EXISTS switchboard.tool_call_start(uuid, text, text, jsonb, interval);
DROP FUNCTION IF EXISTS switchboard.tool_call_take(uuid);
DROP FUNCTION IF EXISTS switchboard.replica_heartbeat(text, jsonb);

ALTER TABLE switchboard.event_horizon ADD COLUMN reap_seen_tick bigint NOT NULL DEFAULT 0;
UPDATE switchboard.event_horizon SET reap_seen_tick = coalesce((SELECT max(tick) FROM switchboard.event_ticks), 0);
COMMENT ON COLUMN switchboard.event_horizon.reap_seen_tick IS
    'The newest tick the last reap_events() call saw. No newer tick at the next call means no relay ticked in between: that call ticks itself (event_tick()), so retention holds with no relay running.';
COMMENT ON TABLE switchboard.event_horizon IS
    'One row: what reap_events() has reaped (reaped_tick, the oldest retained tick; reaped_through, the highest event id deleted), as event_window() reports it, and the newest tick it saw.';
COMMENT ON TABLE switchboard.tickets IS
    'Single-use WebSocket tickets (UNLOGGED): only the SHA-256 is stored; consume_ticket_v2() deletes it.';
