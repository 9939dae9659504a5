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

INSERT INTO pipeline_ranks BY NAME
-- Per rank and step, from tracelab.derived.pipeline (Arrow table _tl_pipeline_ranks).
-- Parameters: $run.
SELECT $run AS run_id, * FROM _tl_pipeline_ranks;
