-- Floor: one round trip and nothing else.
SELECT 1;
