-- Applies db/functions/82_metrics.sql (switchboard.metrics_snapshot(), the
-- index-backed gauges behind /metrics and the chart's alerts). No schema
-- change: function files are re-applied only when a new version applies.
SELECT 1;
