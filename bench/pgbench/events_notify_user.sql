-- Switchboard: one notify_user per transaction (no lock since V0009; one NOTIFY
-- per transaction, or none with event_ticker.publishers_notify off).
SELECT switchboard.notify_user(:uid, 'bench.event', '{"n": 1}');
