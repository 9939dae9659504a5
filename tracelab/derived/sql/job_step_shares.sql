-- Per step of a run, the lost-time shares pooled over its ranks: what a step cost, as the report
-- gates it (median over the steady steps) and the breakdown shows it (`*_share_median`).
CREATE OR REPLACE VIEW job_step_shares AS
SELECT run_id, step, any_value(ordinal) AS ordinal, bool_and(steady) AS steady,
       count(*) AS ranks,
       sum(comm_ns - overlapped_comm_ns) / sum(step_ns) AS exposed_comm_share,
       sum(overlapped_comm_ns) / nullif(sum(comm_ns), 0) AS overlap_share,
       sum(wait_ns) / sum(step_ns) AS wait_share,
       sum(transfer_ns) / sum(step_ns) AS transfer_share,
       sum(bubble_ns + stall_ns) / sum(step_ns) AS pipeline_idle_share
FROM step_parts WHERE step_ns > 0 GROUP BY run_id, step;
-- @column run_id: The run.
-- @column step: The step.
-- @column ordinal: step_spans.ordinal.
-- @column steady: Whether the step is in the steady state on every rank.
-- @column ranks: Ranks that have the step.
-- @column exposed_comm_share: Communication not under compute (transfer, waits, pipeline waits) over the step time, pooled over ranks.
-- @column overlap_share: Communication under compute over all communication, pooled over ranks (NULL without communication).
-- @column wait_share: The wait part (waiting for the last rank at collectives) over the step time.
-- @column transfer_share: The transfer part over the step time.
-- @column pipeline_idle_share: Pipeline bubble and stall over the step time.
