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

INSERT INTO time_parts BY NAME
-- The merged segments of tracelab.derived.parts' sweep (Arrow table _tl_parts, named columns).
-- Parameters: $run (derive() fills a batch of ranks at a time).
SELECT $run AS run_id, rank, step, start_ns, end_ns, part FROM _tl_parts;
