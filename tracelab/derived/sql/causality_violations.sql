-- clock_offsets.causality_violations: matches that, aligned, end on the rank before the last
-- rank arrived by more than both ranks' uncertainties. Parameters: $run.
UPDATE clock_offsets SET causality_violations = v.n
FROM (SELECT m.rank, count(*) FILTER (
          WHERE m.end_ns < m.last_arrival_ns - coalesce(o.uncertainty_ns, 0)
                           - coalesce(lo.uncertainty_ns, 0)) AS n
      FROM matched_collectives m
      JOIN clock_offsets o ON o.run_id = m.run_id AND o.rank = m.rank
      JOIN clock_offsets lo ON lo.run_id = m.run_id AND lo.rank = m.last_rank
      WHERE m.run_id = $run GROUP BY m.rank) v
WHERE clock_offsets.run_id = $run AND clock_offsets.rank = v.rank;
