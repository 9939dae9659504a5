INSERT INTO clock_offsets BY NAME
-- When the clocks component failed: offsets of 0 for every rank (method 'none'), so that the
-- rest can still be derived. Parameters: $run.
SELECT run_id, rank, 0 AS offset_ns, NULL AS uncertainty_ns, 'none' AS method,
       min(rank) OVER () AS reference_rank, host, 0 AS matches, 0 AS causality_violations
FROM ranks WHERE run_id = $run;
