-- The lost-time model per rank and step: compute_ns + transfer_ns + memcpy_ns + wait_ns +
-- bubble_ns + stall_ns + host_ns + idle_ns = step_ns exactly. 'pipeline' time is split into the
-- bubble the schedule needs (the replay of the observed order with median op times and free
-- communication) and the stall beyond it. Also HTA's communication measures.
CREATE TABLE IF NOT EXISTS step_parts (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The rank.
    rank INTEGER NOT NULL,
    -- The step.
    step INTEGER NOT NULL,
    -- step_spans.ordinal.
    ordinal INTEGER NOT NULL,
    -- step_spans.steady.
    steady BOOLEAN NOT NULL,
    -- The rank's step time (step_spans.dur_ns).
    step_ns BIGINT NOT NULL,
    -- Computing (device kernels; on host-only ranks, operator time minus the thread's own
    -- communication waits).
    compute_ns BIGINT NOT NULL,
    -- Communication data movement that compute does not hide.
    transfer_ns BIGINT NOT NULL,
    -- Device memcpy/memset that neither compute nor communication hides.
    memcpy_ns BIGINT NOT NULL,
    -- Blocked in a group collective waiting for the last rank to arrive (comm_attribution
    -- says for whom).
    wait_ns BIGINT NOT NULL,
    -- Pipeline idle the schedule itself needs (at most the rank's inherent idle).
    bubble_ns BIGINT NOT NULL,
    -- Pipeline idle beyond the schedule's need.
    stall_ns BIGINT NOT NULL,
    -- Waiting on the host (Python, data loading, kernel launches, sleeps).
    host_ns BIGINT NOT NULL,
    -- The device idle while the host waits on it (synchronization).
    idle_ns BIGINT NOT NULL,
    -- HTA's communication time: union of communication intervals (transfer and waiting).
    comm_ns BIGINT NOT NULL,
    -- HTA's overlapped communication: communication under compute.
    overlapped_comm_ns BIGINT NOT NULL,
    PRIMARY KEY (run_id, rank, step)
);

INSERT INTO step_parts BY NAME
-- time_parts summed per rank and step, pipeline time split at the inherent idle, and the
-- sweep's communication measures (Arrow tables _tl_parts: the batch's time_parts rows, and
-- _tl_measures), of the batch of ranks $lo..$hi (derive() fills a batch at a time). Parameters: $run, $lo, $hi.
WITH p AS (
    SELECT rank, step,
           coalesce(sum(end_ns - start_ns) FILTER (WHERE part = 'compute'), 0) AS compute,
           coalesce(sum(end_ns - start_ns) FILTER (WHERE part = 'transfer'), 0) AS transfer,
           coalesce(sum(end_ns - start_ns) FILTER (WHERE part = 'memcpy'), 0) AS memcpy,
           coalesce(sum(end_ns - start_ns) FILTER (WHERE part = 'wait'), 0) AS wait,
           coalesce(sum(end_ns - start_ns) FILTER (WHERE part = 'pipeline'), 0) AS pipeline,
           coalesce(sum(end_ns - start_ns) FILTER (WHERE part = 'host'), 0) AS host,
           coalesce(sum(end_ns - start_ns) FILTER (WHERE part = 'idle'), 0) AS idle
    FROM _tl_parts GROUP BY rank, step
),
pr AS (SELECT rank, step, inherent_idle_ns FROM pipeline_ranks WHERE run_id = $run),
q AS (
    SELECT s.rank, s.step, s.ordinal, s.steady, s.dur_ns,
           coalesce(p.compute, 0) AS compute, coalesce(p.transfer, 0) AS transfer,
           coalesce(p.memcpy, 0) AS memcpy, coalesce(p.wait, 0) AS wait,
           coalesce(p.pipeline, 0) AS pipeline, coalesce(p.host, 0) AS host,
           coalesce(p.idle, 0) AS idle, pr.inherent_idle_ns AS inherent,
           coalesce(m.comm_ns, 0) AS comm_ns, coalesce(m.overlapped_comm_ns, 0) AS over_ns
    FROM step_spans s LEFT JOIN p USING (rank, step) LEFT JOIN pr USING (rank, step)
    LEFT JOIN _tl_measures m USING (rank, step)
    WHERE s.run_id = $run AND s.rank BETWEEN $lo AND $hi
)
SELECT $run AS run_id, rank, step, ordinal, steady, dur_ns AS step_ns, compute AS compute_ns,
       transfer AS transfer_ns, memcpy AS memcpy_ns, wait AS wait_ns,
       least(pipeline, coalesce(inherent, pipeline)) AS bubble_ns,
       pipeline - least(pipeline, coalesce(inherent, pipeline)) AS stall_ns,
       host AS host_ns, idle AS idle_ns, comm_ns, over_ns AS overlapped_comm_ns
FROM q;
