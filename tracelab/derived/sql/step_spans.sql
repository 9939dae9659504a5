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

INSERT INTO step_spans BY NAME
-- Per rank, in step order (tracelab.derived.steps). Parameters: $run, $warmup, $stepless (the
-- run's ranks without ProfilerStep spans: no events file is read when it is empty; otherwise
-- every rank's file is opened, the semi-join prunes none).
WITH s AS (
    SELECT rank, step, start_ns AS hs, end_ns AS he, device_end_ns AS de, 'profiler_step' AS src
    FROM steps WHERE run_id = $run
),
whole AS (
    SELECT rank, 0 AS step, min(ts_ns) AS hs, max(ts_ns + dur_ns) AS he,
           max(ts_ns + dur_ns) FILTER (WHERE on_device) AS de, 'whole_trace' AS src
    -- (len() > 0, a constant, lets DuckDB drop the read; list_contains instead of IN took
    -- 2.9 s for 2,000 stepless ranks, a scan of the list per event)
    FROM events WHERE run_id = $run AND len($stepless::INTEGER[]) > 0
      AND rank IN (SELECT unnest($stepless::INTEGER[])) GROUP BY rank
),
a AS (SELECT *, greatest(he, coalesce(de, he)) AS e FROM (FROM s UNION ALL FROM whole)),
t AS (
    SELECT *, greatest(hs, coalesce(max(e) OVER (PARTITION BY rank ORDER BY step
                       ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), hs)) AS st
    FROM a
),
u AS (
    SELECT *, coalesce(lead(st) OVER (PARTITION BY rank ORDER BY step), greatest(e, st)) AS en,
           dense_rank() OVER (ORDER BY step) - 1 AS ordinal
    FROM t
),
n AS (SELECT count(DISTINCT step) AS steps FROM u)
SELECT $run AS run_id, u.rank, u.step, u.ordinal,
       u.ordinal >= $warmup OR n.steps <= $warmup AS steady, u.src AS source,
       u.hs AS host_start_ns, u.he AS host_end_ns, u.de AS device_end_ns,
       ref_ns(u.st, o.o) AS start_ns, ref_ns(u.en, o.o) AS end_ns, u.en - u.st AS dur_ns
FROM u CROSS JOIN n JOIN run_offsets($run) o ON o.rank = u.rank;
