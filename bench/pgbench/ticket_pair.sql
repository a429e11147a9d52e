-- One WebSocket handshake's worth of tickets: issue then consume, as one statement
-- (consume_ticket_v2 sees issue_ticket_v2's row: a volatile PL/pgSQL call takes a new snapshot).
SELECT user_id FROM switchboard.consume_ticket_v2(switchboard.issue_ticket_v2(:uid, NULL));
