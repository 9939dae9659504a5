-- Per step of a run and parallel dimension, the exposed communication of that dimension pooled
-- over the ranks (comm_attribution by process_groups.dim): transfer and waiting over the
-- step time. Summed over a step's dims they are job_step_shares' transfer_share and
-- wait_share (every transfer and wait segment lies under communication).
CREATE OR REPLACE VIEW job_step_dim_shares AS
WITH t AS (SELECT run_id, step, sum(step_ns) AS step_ns, any_value(ordinal) AS ordinal,
                  bool_and(steady) AS steady
           FROM step_parts WHERE step_ns > 0 GROUP BY run_id, step),
a AS (SELECT run_id, step, dim,
             coalesce(sum(exposed_ns) FILTER (WHERE part = 'transfer'), 0) AS transfer_ns,
             coalesce(sum(exposed_ns) FILTER (WHERE part = 'wait'), 0) AS wait_ns
      FROM comm_attribution WHERE part IN ('transfer', 'wait') GROUP BY run_id, step, dim)
SELECT a.run_id, a.step, t.ordinal, t.steady, a.dim, a.transfer_ns, a.wait_ns,
       a.transfer_ns / t.step_ns AS transfer_share, a.wait_ns / t.step_ns AS wait_share
FROM a JOIN t USING (run_id, step);
-- @column run_id: The run.
-- @column step: The step.
-- @column ordinal: step_spans.ordinal.
-- @column steady: Whether the step is in the steady state on every rank.
-- @column dim: The parallel dimension (process_groups.dim; 'pp' for send/recv, 'unknown' where no group is known).
-- @column transfer_ns: The transfer part of the dimension's communication, summed over the ranks.
-- @column wait_ns: The wait part of the dimension's collectives, summed over the ranks.
-- @column transfer_share: transfer_ns over the step time summed over the ranks.
-- @column wait_share: wait_ns over the step time summed over the ranks.
