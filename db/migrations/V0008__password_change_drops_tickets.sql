-- V0008: set_user_password_hash also drops the user's unused WebSocket tickets
-- (a ticket minted just before a password change could otherwise open a socket
-- just after it). Function change only: db/functions/60_users.sql, re-applied by
-- the afterAll callback.
SELECT 1;
