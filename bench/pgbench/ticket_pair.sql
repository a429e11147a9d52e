-- One WebSocket handshake's worth of tickets: issue then consume, as one statement
-- (consume_ticket sees issue_ticket's row: a volatile PL/pgSQL call takes a new snapshot).
SELECT switchboard.consume_ticket(switchboard.issue_ticket(:uid));
