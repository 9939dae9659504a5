-- tracelab store schema: the base tables (version 7 with derived.sql; tracelab.store.SCHEMA_VERSION).
--
-- Version 7 keeps the trace's [memory] instants beside them (`memory-OFFSET.parquet`, kind
-- 'memory'): `memory` is a view over those files and the collector's step peaks (memory_peaks).
-- Version 4 keeps the events out of the DuckDB file: they are Parquet files in the store's folder
-- (`STORE.duckdb` -> `STORE.parquet/run=ID/rank=R/events-OFFSET.parquet`, tracelab/store/files.py),
-- listed in `parquet_files`, and `events` is a view over exactly the files listed there. The view
-- is replaced in the transaction that commits a run, so a reader sees a run's files whole or not
-- at all. Versions 2 and 3 held the events in a table (3 added hang_verdicts); `tracelab migrate`
-- turns such a store into this one.
--
-- Conventions: every time is an integer number of nanoseconds since the Unix epoch (`*_ns`),
-- every duration an integer number of nanoseconds (`dur_ns`), every size a number of bytes
-- (`*_bytes`). Rows of one run share its `run_id`; deleting a run deletes every row carrying it.
-- The schema version is stored in `tracelab_meta` under `schema_version`. The `-- ` lines above a
-- table or column become its DuckDB comment.

-- Key/value facts about the store itself.
CREATE TABLE IF NOT EXISTS tracelab_meta (
    -- Name of the setting, e.g. 'schema_version'.
    key VARCHAR PRIMARY KEY,
    -- Its value, as text.
    value VARCHAR NOT NULL
);

CREATE SEQUENCE IF NOT EXISTS run_id_seq START 1;

-- One row per ingested run (a training job's capture, any subset of its ranks).
CREATE TABLE IF NOT EXISTS runs (
    -- Surrogate key used by every other table.
    run_id INTEGER PRIMARY KEY,
    -- Unique, user-chosen name (`--run`), defaults to the folder's name.
    name VARCHAR NOT NULL UNIQUE,
    -- Paths the run was ingested from, as given on the command line (JSON list of strings).
    source JSON NOT NULL,
    -- When the ingest committed (UTC).
    created_at TIMESTAMP NOT NULL,
    -- Ranks in the whole job (from distributedInfo or the manifest); NULL when unknown.
    world_size INTEGER,
    -- Number of ranks actually captured in this run.
    rank_count INTEGER NOT NULL,
    -- Free-form metadata: the capture manifest when there is one, tracelab's version, options.
    metadata JSON NOT NULL,
    -- Files skipped under `--skip-bad`: JSON list of {file, error}.
    skipped JSON NOT NULL
);

-- One row per captured rank of a run.
CREATE TABLE IF NOT EXISTS ranks (
    -- The run this rank belongs to.
    run_id INTEGER NOT NULL,
    -- Global rank in the job.
    rank INTEGER NOT NULL,
    -- Host name, when the trace or manifest says.
    host VARCHAR,
    -- World size this rank reported.
    world_size INTEGER,
    -- Communication backend of the default group (nccl, gloo, ...).
    backend VARCHAR,
    -- Device name (e.g. 'NVIDIA H100', 'cpu').
    device VARCHAR,
    -- Device memory capacity in bytes, when known (deviceProperties.totalGlobalMem).
    device_memory_bytes BIGINT,
    -- Paths of the trace files this rank came from (one per profiling window), JSON list.
    files JSON NOT NULL,
    -- Their total size in bytes.
    file_bytes BIGINT NOT NULL,
    -- baseTimeNanoseconds of the trace, 0 when the trace had none (timestamps already absolute).
    base_time_ns BIGINT NOT NULL,
    -- Estimated offset of this rank's clock relative to rank 0's: local time minus reference time,
    -- so reference = ts_ns - clock_offset_ns. NULL when not measured.
    clock_offset_ns BIGINT,
    -- Uncertainty (half-width) of that offset; NULL when not measured.
    clock_uncertainty_ns BIGINT,
    -- Pipeline stage of this rank, when known (manifest or annotations).
    pp_stage INTEGER,
    -- Parallelism coordinates {dp, tp, pp, cp, ep}, when known.
    coords JSON,
    -- deviceProperties of the trace (JSON list).
    device_properties JSON,
    -- The trace's other top-level metadata keys (schemaVersion, trace_id, ...).
    trace_metadata JSON NOT NULL,
    -- Number of complete (X) events of this rank.
    event_count BIGINT NOT NULL,
    -- Its process groups (distributedInfo.pg_config, or the capture's manifest): the number of
    -- its configuration in process_group_configs (process_group_configs.config).
    process_groups_config INTEGER NOT NULL,
    PRIMARY KEY (run_id, rank)
);

-- Each distinct process-group configuration of a run's ranks, once (ranks.process_groups_config
-- names a rank's): every rank of a job usually holds the same one, a list of every group with its
-- member ranks, 59 KB at 10,000 ranks, so a copy per rank grew as ranks squared.
CREATE TABLE IF NOT EXISTS process_group_configs (
    -- The run.
    run_id INTEGER NOT NULL,
    -- Its number in the run, from 0 (in the order of the lowest rank holding it).
    config INTEGER NOT NULL,
    -- The groups as in distributedInfo.pg_config (JSON list of {pg_name, pg_desc, pg_size,
    -- ranks}).
    process_groups JSON NOT NULL,
    PRIMARY KEY (run_id, config)
);

-- The Parquet files of the runs' per-rank tables, the store's catalog of them: a file is listed
-- only once it is whole and in place, and removed from the folder once no row lists it.
CREATE TABLE IF NOT EXISTS parquet_files (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The rank (of a 'time_parts' file, which holds a batch of ranks: the batch's first).
    rank INTEGER NOT NULL,
    -- Which table's rows the file holds: 'events', 'memory' (the trace's [memory] instants), or
    -- the derived 'time_parts' (tracelab.derived.part_files).
    kind VARCHAR NOT NULL,
    -- Path inside the store's folder, '/'-separated (run=ID/rank=R/events-OFFSET.parquet,
    -- run=ID/rank=R/memory-OFFSET.parquet, run=ID/parts/time_parts-RANK-TOKEN.parquet).
    path VARCHAR NOT NULL PRIMARY KEY,
    -- Rows in the file.
    row_count BIGINT NOT NULL,
    -- Size of the file.
    file_bytes BIGINT NOT NULL
);

-- Every complete (ph = 'X') event of every rank: a view over the Parquet files that
-- parquet_files lists (tracelab/store/files.py writes it; this empty form is a store's first).
CREATE OR REPLACE VIEW events AS SELECT
    CAST(NULL AS INTEGER) AS run_id,
    CAST(NULL AS INTEGER) AS rank,
    CAST(NULL AS BIGINT) AS idx,
    CAST(NULL AS VARCHAR) AS cat,
    CAST(NULL AS VARCHAR) AS name,
    CAST(NULL AS BIGINT) AS pid,
    CAST(NULL AS BIGINT) AS tid,
    CAST(NULL AS VARCHAR) AS lane_label,
    CAST(NULL AS BIGINT) AS ts_ns,
    CAST(NULL AS BIGINT) AS dur_ns,
    CAST(NULL AS VARCHAR) AS category,
    CAST(NULL AS BOOLEAN) AS on_device,
    CAST(NULL AS BIGINT) AS stream,
    CAST(NULL AS BIGINT) AS correlation,
    CAST(NULL AS BIGINT) AS external_id,
    CAST(NULL AS INTEGER) AS step,
    CAST(NULL AS JSON) AS args
WHERE false;
-- @column run_id: The run (the file's run= folder).
-- @column rank: The rank whose trace held the event (the file's rank= folder).
-- @column idx: Position of the event in the rank's traceEvents list (stable id within the rank): the file's own idx plus the OFFSET in its name, the events of the rank's earlier windows.
-- @column cat: Kineto category as written (kernel, cpu_op, cuda_runtime, user_annotation, ...).
-- @column name: Event name as written (never trusted: escape before rendering).
-- @column pid: Kineto pid: the OS process for host events, the device index for GPU events.
-- @column tid: Kineto tid: the OS thread for host events, the stream for GPU events.
-- @column lane_label: pid/tid when the trace wrote them as strings (e.g. 'Spans'); NULL otherwise.
-- @column ts_ns: Start, absolute: baseTimeNanoseconds + ts * 1000, rounded to the nanosecond.
-- @column dur_ns: Duration.
-- @column category: tracelab's classification, applied once at ingest (see tracelab/ingest/classify.py): compute, communication, memcpy, memset, sync, runtime, cpu_op, annotation, python, other.
-- @column on_device: True for events that run on the device (kernels, GPU memcpy/memset, GPU annotations).
-- @column stream: CUDA/HIP stream for device events (args.stream, else tid); NULL for host events.
-- @column correlation: args.correlation: links a runtime launch to the device work it launched.
-- @column external_id: args['External id']: links device work to the host op that issued it.
-- @column step: ProfilerStep number the event belongs to (host: enclosing step; device: its launch's step).
-- @column args: The event's args, verbatim JSON (a string column of the Parquet file).

-- ProfilerStep#N spans per rank.
CREATE TABLE IF NOT EXISTS steps (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The rank.
    rank INTEGER NOT NULL,
    -- N of ProfilerStep#N.
    step INTEGER NOT NULL,
    -- Start of the host-side step annotation.
    start_ns BIGINT NOT NULL,
    -- End of the host-side step annotation.
    end_ns BIGINT NOT NULL,
    -- End of the last device event launched in the step (>= end_ns on GPU runs); NULL on CPU runs.
    device_end_ns BIGINT,
    PRIMARY KEY (run_id, rank, step)
);

-- Names of processes and threads (Kineto 'M' events), for timeline lanes.
CREATE TABLE IF NOT EXISTS lanes (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The rank.
    rank INTEGER NOT NULL,
    -- Kineto pid.
    pid BIGINT,
    -- Kineto tid; NULL for a process-level name.
    tid BIGINT,
    -- 'process_name', 'thread_name', 'process_labels', ...
    kind VARCHAR NOT NULL,
    -- The name (escape before rendering).
    value VARCHAR,
    -- Sort index when the trace gives one.
    sort_index BIGINT
);

-- One row per collective or point-to-point operation seen on a rank.
CREATE TABLE IF NOT EXISTS collectives (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The rank that took part.
    rank INTEGER NOT NULL,
    -- Where the row came from: 'kernel' (NCCL/RCCL kernel), 'host' (gloo or c10d host op),
    -- 'collector' (tracelab's own timing), 'flight_recorder'.
    source VARCHAR NOT NULL,
    -- Normalized kind: all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all,
    -- send, recv, barrier, gather, scatter, unknown.
    op VARCHAR NOT NULL,
    -- Process group name (pg_name), NULL when the trace does not say.
    pg_name VARCHAR,
    -- Process group description (e.g. 'default_pg').
    pg_desc VARCHAR,
    -- Global ranks of the group, JSON list; NULL when unknown. Of a named group, on its first
    -- call of the run only (the lowest rank's first call, from a trace or the collector's
    -- records): every call of that group has the same ranks, and a 10,000-rank group's list
    -- on every call would grow as ranks x calls x group size.
    pg_ranks JSON,
    -- Number of ranks in the group.
    group_size INTEGER,
    -- Per-group sequence number when the source has one (collector, flight recorder, newer traces).
    seq BIGINT,
    -- Bytes sent by this rank (input), when known.
    in_bytes BIGINT,
    -- Bytes received by this rank (output), when known.
    out_bytes BIGINT,
    -- Element type (Float, BFloat16, ...), when known.
    dtype VARCHAR,
    -- Peer rank for send/recv, when known.
    peer INTEGER,
    -- Host enqueue time, when known.
    enqueue_ns BIGINT,
    -- Start of the operation (kernel start on GPU, host start on gloo); NULL when the source has
    -- no timing (Flight Recorder on gloo).
    start_ns BIGINT,
    -- End of the operation; NULL like start_ns.
    end_ns BIGINT,
    -- ProfilerStep the operation belongs to, when known.
    step INTEGER,
    -- events.idx of the event this row came from; NULL for collector/flight-recorder rows.
    event_idx BIGINT,
    -- All-to-all only: bytes this rank sent to each rank of the group, in group-rank order, as
    -- the collector recorded them (docs/capture-format.md); NULL for other sources and ops.
    in_split_bytes BIGINT[],
    -- All-to-all only: bytes this rank received from each rank of the group, like
    -- in_split_bytes.
    out_split_bytes BIGINT[]
);

-- The collector's per-step memory peaks (source 'step_peak'): the rows of the `memory` view that
-- are not the trace's [memory] instants, which stay in Parquet files (they grow with events).
CREATE TABLE IF NOT EXISTS memory_peaks (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The rank.
    rank INTEGER NOT NULL,
    -- 'step_peak' (the collector's).
    source VARCHAR NOT NULL,
    -- End of the step.
    ts_ns BIGINT NOT NULL,
    -- ProfilerStep, when known.
    step INTEGER,
    -- Device type code (0 CPU, 1 CUDA, ...).
    device_type INTEGER,
    -- Device index.
    device_id INTEGER,
    -- NULL for step peaks.
    delta_bytes BIGINT,
    -- The step's peak allocated.
    allocated_bytes BIGINT,
    -- The step's peak reserved.
    reserved_bytes BIGINT
);

-- Memory samples: the trace's [memory] instants and the collector's per-step peaks. A view: the
-- peaks of memory_peaks, and the instants of the Parquet files that parquet_files lists as
-- 'memory' (run=ID/rank=R/memory-OFFSET.parquet, tracelab/store/files.py writes the view; this
-- form, without files, is a store's first).
CREATE OR REPLACE VIEW memory AS SELECT *, CAST(NULL AS BIGINT) AS idx FROM memory_peaks;
-- @column run_id: The run.
-- @column rank: The rank.
-- @column source: 'trace' ([memory] instant: allocation or free) or 'step_peak' (collector).
-- @column ts_ns: Time of the sample (for step_peak: end of the step).
-- @column step: ProfilerStep, when known.
-- @column device_type: Device type code from the trace (0 CPU, 1 CUDA, ...) or 'cuda'/'cpu' mapped to those codes.
-- @column device_id: Device index.
-- @column delta_bytes: Size of this allocation (+) or free (-); NULL for step peaks.
-- @column allocated_bytes: Allocated bytes after the event, or the step's peak allocated.
-- @column reserved_bytes: Reserved bytes after the event, or the step's peak reserved.
-- @column idx: Position of the instant among its rank's [memory] instants, in the order its traces wrote them (its earlier windows' first): of instants at one ts_ns, the order they happened in; NULL for step peaks.

-- Named baselines for CI reports: `tracelab baseline save NAME`.
CREATE TABLE IF NOT EXISTS baselines (
    -- Baseline name.
    name VARCHAR PRIMARY KEY,
    -- Name of the run it pins (kept by name so that it survives re-ingest of that run).
    run_name VARCHAR NOT NULL,
    -- When it was saved (UTC).
    saved_at TIMESTAMP NOT NULL
);

-- Where a hung job's ranks parted, from the Flight Recorder dumps ingested with the run
-- (CAPTURE/flight-recorder/, or PyTorch's nccl_trace_rank_N next to the traces; docs/hang.md).
-- One row per divergence, the verdict first: the same objects as `tracelab hang --format json`'s
-- `verdict` and `also`. A run without dumps, or whose ranks' dumps agree, has no row.
CREATE TABLE IF NOT EXISTS hang_verdicts (
    -- The run.
    run_id INTEGER NOT NULL,
    -- 0: the verdict (the earliest divergence); 1, 2, ...: later ones, usually its consequences.
    ordinal INTEGER NOT NULL,
    -- not_entered, missing_rank, op_mismatch, size_mismatch or dtype_mismatch.
    kind VARCHAR NOT NULL,
    -- The process group's name as the dumps write it ('0' is the default group).
    process_group VARCHAR NOT NULL,
    -- The group's global ranks (JSON list).
    members JSON NOT NULL,
    -- The collective's sequence number in the group (p2p: p2p_seq_id); NULL when none.
    seq BIGINT,
    -- True when the numbering is point-to-point's.
    p2p BOOLEAN NOT NULL,
    -- The op the ranks enqueued at that number, as the dump names it (e.g. 'nccl:all_reduce');
    -- text from a dump: escape before rendering.
    op VARCHAR,
    -- Ranks that enqueued it: JSON {rank: {seq, op, input_sizes, input_dtypes, state, stack}}.
    entered JSON NOT NULL,
    -- Ranks that did not: JSON {rank: their last op in the group, or null (no dump)}.
    absent JSON NOT NULL,
    -- The dumps read: JSON list of {rank, file, version, entries}.
    dumps JSON NOT NULL,
    PRIMARY KEY (run_id, ordinal)
);
