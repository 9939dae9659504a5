-- Macros over the store's tables the derived definitions share (created after _macros.sql by
-- tracelab.derived.sqlfiles.create_macros, on a connection to a store).

-- The clock offsets of one run, to join on rank: (rank, o).
CREATE OR REPLACE TEMP MACRO run_offsets(run) AS TABLE
    SELECT rank, offset_ns AS o FROM clock_offsets WHERE run_id = run;
