-- The job's steps: per run and step, over its ranks.
CREATE OR REPLACE VIEW job_steps AS
SELECT run_id, step, any_value(ordinal) AS ordinal, bool_and(steady) AS steady,
       min(start_ns) AS start_ns, max(end_ns) AS end_ns, avg(dur_ns) AS dur_ns,
       min(dur_ns) AS fastest_ns, arg_max(rank, [dur_ns, -rank]) AS slowest_rank, count(*) AS ranks
FROM step_spans GROUP BY run_id, step;
-- @column run_id: The run.
-- @column step: N of ProfilerStep#N.
-- @column ordinal: Position among the run's steps.
-- @column steady: Whether the step is in the steady state on every rank.
-- @column start_ns: Earliest start over the ranks.
-- @column end_ns: Latest end over the ranks.
-- @column dur_ns: The job's step time: the mean over its ranks of their step times (steps
-- tile each rank's run, so this is the run's wall time per step; docs/metrics.md "Steps").
-- @column fastest_ns: The fastest rank's step time.
-- @column slowest_rank: The rank with the longest step (the lowest such rank on a tie).
-- @column ranks: Ranks that have the step.
