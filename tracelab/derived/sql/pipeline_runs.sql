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

INSERT INTO pipeline_runs BY NAME
-- The schedule tracelab.derived.pipeline recognised (Arrow table _tl_pipeline_run). Parameters:
-- $run.
SELECT $run AS run_id, * FROM _tl_pipeline_run;
