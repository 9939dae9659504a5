-- tracelab's derived layer: one definition for every number (docs/metrics.md).
--
-- These tables are computed once per run, inside the ingest transaction, by tracelab.derived
-- from the base tables (tables.sql); `tracelab rederive` recomputes them. The analyzers, the
-- reports and the app read them and never re-derive what they hold. Conventions as in
-- tables.sql. Unless a column says otherwise, every time here is on the *reference clock*:
-- a rank's own time minus its clock_offsets.offset_ns, so times of different ranks compare.
-- The `-- ` lines above a table or column become its DuckDB comment (DESCRIBE in `tracelab
-- sql` shows them).

-- A run's profiler steps as every surface counts them, one row per rank and step. A step runs
-- from its ProfilerStep#N span's start (or the previous step's end, if later) to the later of
-- the span's end and the end of the device work launched in it; a gap before the next step is
-- given to the earlier step, so a rank's steps tile its profiled time back to back and
-- per-step figures add up to the run (the TensorBoard plugin's step boundaries, plus tiling).
-- A trace without ProfilerStep spans is one step (step 0) over the whole trace.
CREATE TABLE IF NOT EXISTS step_spans (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The rank.
    rank INTEGER NOT NULL,
    -- N of ProfilerStep#N (0 for a trace analysed as one step).
    step INTEGER NOT NULL,
    -- Position of the step among the run's steps, 0 for the first, equal on every rank.
    ordinal INTEGER NOT NULL,
    -- Whether the step is in the steady state: not one of the first warm-up steps under the
    -- default policy (tracelab.defaults.WARMUP_STEPS; all steps when the run has no more).
    steady BOOLEAN NOT NULL,
    -- 'profiler_step' (a ProfilerStep#N span) or 'whole_trace' (no spans: the trace is one step).
    source VARCHAR NOT NULL,
    -- Start of the host-side span, on the rank's own clock.
    host_start_ns BIGINT NOT NULL,
    -- End of the host-side span, on the rank's own clock.
    host_end_ns BIGINT NOT NULL,
    -- End of the last device event launched in the step, on the rank's own clock; NULL on
    -- host-only ranks.
    device_end_ns BIGINT,
    -- Start of the tiled step.
    start_ns BIGINT NOT NULL,
    -- End of the tiled step (the next step's start, or the last step's own end).
    end_ns BIGINT NOT NULL,
    -- end_ns - start_ns: the rank's step time.
    dur_ns BIGINT NOT NULL,
    PRIMARY KEY (run_id, rank, step)
);

-- Each rank's clock offset to the reference rank (the lowest captured rank) and how sure it
-- is. Offsets come from the collector's clock exchange when the capture has one; ranks whose
-- traces name one host share its clock (offset 0); otherwise they are bounded by causality over
-- matched collectives (no rank ends a collective before every rank has arrived).
CREATE TABLE IF NOT EXISTS clock_offsets (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The rank.
    rank INTEGER NOT NULL,
    -- Its clock minus the reference clock: reference time = own time - offset_ns.
    offset_ns BIGINT NOT NULL,
    -- Half-width of the interval the true offset lies in (the clock resolution when measured
    -- or shared, the causality bound when estimated); NULL when nothing bounds it.
    uncertainty_ns BIGINT,
    -- 'reference', 'collector', 'same_host', 'collectives' (causality bounds) or 'none'.
    method VARCHAR NOT NULL,
    -- The rank whose clock is the reference.
    reference_rank INTEGER NOT NULL,
    -- Host the rank ran on (trace host_name, capture manifest, or trace file name), when known.
    host VARCHAR,
    -- Matched collectives the estimate used (0 unless method = 'collectives').
    matches INTEGER NOT NULL,
    -- Matched collectives that, after alignment, end on this rank before the last rank arrived
    -- by more than the uncertainties allow: a sign of drift or of a wrong offset.
    causality_violations INTEGER NOT NULL,
    PRIMARY KEY (run_id, rank)
);

-- Group collectives matched across the ranks that took part, one row per (match, rank).
-- Matching key: (process group, sequence number) when every row of the source has one, else
-- (process group, op, step, occurrence in the step). One source per run: the collector's
-- timings, else NCCL/RCCL kernels, else host annotations (gloo), whichever times the most
-- collectives on the most ranks.
CREATE TABLE IF NOT EXISTS matched_collectives (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The matching key, unique within the run.
    match_key VARCHAR NOT NULL,
    -- A rank that took part.
    rank INTEGER NOT NULL,
    -- collectives.source the match comes from.
    source VARCHAR NOT NULL,
    -- Normalized op (all_reduce, all_gather, ...).
    op VARCHAR NOT NULL,
    -- Process group name; NULL when the trace does not say.
    pg_name VARCHAR,
    -- The step of the match (the lowest any rank put it in); NULL outside steps.
    step INTEGER,
    -- Arrival: start of this rank's operation.
    start_ns BIGINT NOT NULL,
    -- End of this rank's operation.
    end_ns BIGINT NOT NULL,
    -- end_ns - start_ns.
    dur_ns BIGINT NOT NULL,
    -- Message size as nccl-tests counts it: the whole buffer (all-gather: the gathered output;
    -- reduce-scatter: the whole input; others: the input); NULL when unknown.
    bytes BIGINT,
    -- Ranks in the process group (the trace's group size, else the ranks matched): the n of
    -- the bus-bandwidth factors.
    group_size INTEGER NOT NULL,
    -- Ranks in the match.
    ranks INTEGER NOT NULL,
    -- The data movement itself: the shortest duration of the match across its ranks (the
    -- TensorBoard plugin's "data transfer time"; needs no clock alignment).
    transfer_ns BIGINT NOT NULL,
    -- dur_ns - transfer_ns: this rank waiting for its peers (the plugin's "synchronizing time").
    wait_ns BIGINT NOT NULL,
    -- The rank that arrived last: the one every other rank waited for (the lowest such rank
    -- when several arrived at the same instant).
    last_rank INTEGER NOT NULL,
    -- The last arrival.
    last_arrival_ns BIGINT NOT NULL,
    -- The last arrival minus the second-last: how late the last rank was (0 on this row unless
    -- rank = last_rank).
    lateness_ns BIGINT NOT NULL,
    -- events.idx of the event the row came from; NULL for collector/flight-recorder rows.
    event_idx BIGINT
);

-- Point-to-point operations (send/recv) on each rank, with the part of each that was data
-- movement: the shortest duration of any p2p op of the same kind and size in the run.
CREATE TABLE IF NOT EXISTS p2p_ops (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The rank.
    rank INTEGER NOT NULL,
    -- send, recv or send_recv.
    op VARCHAR NOT NULL,
    -- The other rank, when the trace says.
    peer INTEGER,
    -- Bytes moved, when known.
    bytes BIGINT,
    -- The step, when inside one.
    step INTEGER,
    -- Start.
    start_ns BIGINT NOT NULL,
    -- End.
    end_ns BIGINT NOT NULL,
    -- Shortest duration of a p2p op of this kind and size in the run: the transfer.
    transfer_ns BIGINT NOT NULL,
    -- (end_ns - start_ns) - transfer_ns: waiting for the peer.
    wait_ns BIGINT NOT NULL,
    -- events.idx of the event; NULL when not from an event.
    event_idx BIGINT
);

-- The lost-time model, as time: each rank's steps cut into disjoint segments, each labelled
-- with the one part of the step it belongs to (docs/metrics.md gives the rules and their order):
-- 'compute', 'transfer' (communication that compute does not hide, the data movement itself),
-- 'memcpy' (device copies/memsets nothing else hides), 'wait' (blocked in a group collective
-- for a peer), 'pipeline' (pipeline ranks: waiting for a stage, or nothing to do inside the
-- pipeline's window), 'host' (the device, or on host-only ranks the training loop, waits on
-- the host: Python, data loading, launches), 'idle' (the device idle while the host waits on it).
-- Segments tile every step exactly; adjacent segments of one part are merged.
CREATE TABLE IF NOT EXISTS time_parts (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The rank.
    rank INTEGER NOT NULL,
    -- The step (step_spans.step).
    step INTEGER NOT NULL,
    -- Start of the segment.
    start_ns BIGINT NOT NULL,
    -- End of the segment.
    end_ns BIGINT NOT NULL,
    -- The part (see the table's comment).
    part VARCHAR NOT NULL
);

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

-- Exposed communication split by the operation behind it: each 'transfer', 'wait' and
-- 'pipeline' segment of time_parts, shared among the communication intervals that cover it, in
-- proportion to their overlap with it. Per (rank, step, part) the rows add up to that part's
-- time in step_parts when every segment of it lies under communication ('pipeline' time with
-- nothing to do has no row).
CREATE TABLE IF NOT EXISTS comm_attribution (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The rank.
    rank INTEGER NOT NULL,
    -- The step.
    step INTEGER NOT NULL,
    -- 'transfer', 'wait' or 'pipeline' (time_parts.part).
    part VARCHAR NOT NULL,
    -- The operation (all_reduce, send, recv, ...; 'unknown' when the trace does not say).
    op VARCHAR NOT NULL,
    -- Its process group, when known.
    pg_name VARCHAR,
    -- Its message size (matched_collectives.bytes), when known.
    bytes BIGINT,
    -- For 'wait': the rank that arrived last (whom this rank waited for); for 'pipeline': the
    -- peer of the send/recv, when known; NULL otherwise.
    culprit_rank INTEGER,
    -- Exposed time.
    exposed_ns BIGINT NOT NULL
);

-- Pipeline schedule actions (stage, F/B/I/W, microbatch) reconstructed from the trace, with
-- the compute measured inside each (not its span, which includes waits on blocking backends).
CREATE TABLE IF NOT EXISTS pipeline_actions (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The rank that ran the action.
    rank INTEGER NOT NULL,
    -- The step.
    step INTEGER NOT NULL,
    -- Pipeline stage.
    stage INTEGER NOT NULL,
    -- F (forward), B (full backward), I (input-grad backward), W (weight-grad backward).
    kind VARCHAR NOT NULL,
    -- Microbatch.
    mb INTEGER NOT NULL,
    -- Start of the action's span.
    span_start_ns BIGINT NOT NULL,
    -- End of the action's span.
    span_end_ns BIGINT NOT NULL,
    -- First compute inside the span.
    start_ns BIGINT NOT NULL,
    -- Last compute inside the span.
    end_ns BIGINT NOT NULL,
    -- Compute time inside the span (union of its compute intervals).
    busy_ns BIGINT NOT NULL
);

-- The pipeline of a run as reconstructed: one row per run that has one.
CREATE TABLE IF NOT EXISTS pipeline_runs (
    -- The run.
    run_id INTEGER PRIMARY KEY,
    -- Where the actions came from: 'pp' (PP: annotations), 'gpipe' (Forward i / Backward i),
    -- 'host_ops' (reconstructed from operator runs between send/recv).
    source VARCHAR NOT NULL,
    -- gpipe, 1f1b, interleaved_1f1b, looped_bfs, zb_h1, zero_bubble, zbv, dualpipev.
    schedule VARCHAR NOT NULL,
    -- The schedule the capture declared, as written; NULL without one.
    schedule_declared VARCHAR,
    -- Ranks in the pipeline.
    ranks INTEGER NOT NULL,
    -- Stages per rank.
    stages_per_rank INTEGER NOT NULL,
    -- Microbatches per step.
    microbatches INTEGER NOT NULL,
    -- Makespan of the replay with median op times and free communication; NULL when the order
    -- could not be replayed.
    inherent_makespan_ns BIGINT,
    -- The same replay with every stage at the mean op time (balanced stages).
    balanced_makespan_ns BIGINT,
    -- 'observed order', 'textbook order' or 'none'.
    inherent_order VARCHAR NOT NULL,
    -- Mean op time per action kind, JSON {"F": ns, ...}.
    op_ns JSON NOT NULL
);

-- Pipeline figures per rank and step: the pipeline's window, and the rank's compute in it.
CREATE TABLE IF NOT EXISTS pipeline_ranks (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The rank.
    rank INTEGER NOT NULL,
    -- The step.
    step INTEGER NOT NULL,
    -- The pipeline's window in the step: first compute of any stage.
    window_start_ns BIGINT NOT NULL,
    -- The pipeline's window in the step: last compute of any stage.
    window_end_ns BIGINT NOT NULL,
    -- The rank's compute inside its actions.
    busy_ns BIGINT NOT NULL,
    -- From the window's start to the rank's first compute (warm-up).
    leading_ns BIGINT NOT NULL,
    -- From the rank's last compute to the window's end (cool-down).
    trailing_ns BIGINT NOT NULL,
    -- Idle the schedule needs on this rank (replay makespan minus the rank's replayed busy
    -- time); NULL when the order could not be replayed.
    inherent_idle_ns BIGINT
);

-- A derived component that failed on a run (the run is still ingested; what depends on the
-- component is left out, and every surface names the component and the reason).
CREATE TABLE IF NOT EXISTS derived_errors (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The component (steps, clocks, collectives, pipeline, parts).
    component VARCHAR NOT NULL,
    -- One line: what failed and why.
    message VARCHAR NOT NULL
);

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
