-- V0008: set_user_password_hash also drops the user's unused WebSocket tickets
-- (a ticket minted just before a password change could otherwise open a socket
-- just after it); the two tool-call entry points share one registration helper
-- (_tool_call_register). Function changes only: db/functions/60_users.sql, re-applied by
-- the afterAll callback.
SELECT 1;
