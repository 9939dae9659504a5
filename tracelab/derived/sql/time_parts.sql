-- The lost-time model, as time: each rank's steps cut into disjoint segments, each labelled
-- with the one part of the step it belongs to (docs/metrics.md gives the rules and their order):
-- 'compute', 'transfer' (communication that compute does not hide, the data movement itself),
-- 'memcpy' (device copies/memsets nothing else hides), 'wait' (blocked in a group collective
-- for a peer), 'pipeline' (pipeline ranks: waiting for a stage, or nothing to do inside the
-- pipeline's window), 'host' (the device, or on host-only ranks the training loop, waits on
-- the host: Python, data loading, launches), 'idle' (the device idle while the host waits on it).
-- Segments tile every step exactly; adjacent segments of one part are merged.
-- Stored as Parquet files in the store folder, one per batch of ranks
-- (STORE.parquet/run=ID/parts/time_parts-RANK-TOKEN.parquet, tracelab.derived.part_files), listed
-- in parquet_files (kind 'time_parts'): the table grows with the events, so it stays out of
-- the DuckDB file and out of the ingest's transaction. This empty form is a store's first.
CREATE OR REPLACE VIEW time_parts AS SELECT
    CAST(NULL AS INTEGER) AS run_id,
    CAST(NULL AS INTEGER) AS rank,
    CAST(NULL AS INTEGER) AS step,
    CAST(NULL AS BIGINT) AS start_ns,
    CAST(NULL AS BIGINT) AS end_ns,
    CAST(NULL AS VARCHAR) AS part
WHERE false;
-- @column run_id: The run.
-- @column rank: The rank.
-- @column step: The step (step_spans.step).
-- @column start_ns: Start of the segment.
-- @column end_ns: End of the segment.
-- @column part: The part (see the view's comment).
