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

INSERT INTO pipeline_actions BY NAME
-- The actions tracelab.derived.pipeline reconstructed (Arrow table _tl_actions, named columns,
-- times already on the reference clock). Parameters: $run.
SELECT $run AS run_id, rank, step, stage, kind, mb, span_start_ns, span_end_ns, start_ns, end_ns,
       busy_ns
FROM _tl_actions;
