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

INSERT INTO derived_errors BY NAME
-- The components that failed (Arrow table _tl_errors: component, message). Parameters: $run.
SELECT $run AS run_id, component, message FROM _tl_errors;
