-- Time per step in each operator (host) and each device op, summed over ranks: what the report's
-- per-op times (op_time, tracelab.report.metrics) divide by the ranks of each step, derived where
-- the lost-time parts read a batch's events anyway, so that a report does not aggregate every
-- rank's events at read time (10,000 ranks: 3.4 s a run). One row per step, step ordinal, kind
-- and name: each batch of ranks inserts its own, which tracelab.derived.parts merges, so that
-- the rows do not depend on how the ranks were batched (Ray's tasks, local threads).
CREATE TABLE IF NOT EXISTS op_totals (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The step (events.step).
    step INTEGER NOT NULL,
    -- The step's ordinal on these ranks (step_spans.ordinal): a report's warm-up filter.
    ordinal INTEGER NOT NULL,
    -- 'kernel': a device event of compute, communication, memcpy or memset; 'op': a host
    -- event of category cpu_op or operator (events.cat, any case).
    kind VARCHAR NOT NULL,
    -- The event name (trace text: escape before rendering).
    name VARCHAR NOT NULL,
    -- Summed duration of its events in that step, over the ranks (HUGEINT: a sum of durations
    -- the ingest accepts, up to 2^62 ns each, can pass 2^63).
    dur_ns HUGEINT NOT NULL,
    -- How many events.
    calls BIGINT NOT NULL
);

INSERT INTO op_totals BY NAME
-- The ranks $lo..$hi (a batch of the parts: its events). Parameters: $run, $lo, $hi.
WITH e AS (
    SELECT e.rank, e.step, e.name, e.dur_ns, e.cat, e.category, e.on_device, s.ordinal
    FROM events e JOIN step_spans s ON s.run_id = e.run_id AND s.rank = e.rank AND s.step = e.step
    WHERE e.run_id = $run AND e.rank BETWEEN $lo AND $hi
)
SELECT $run AS run_id, step, ordinal, 'kernel' AS kind, name, sum(dur_ns) AS dur_ns,
       count(*) AS calls
FROM e WHERE on_device AND category IN ('compute', 'communication', 'memcpy', 'memset')
GROUP BY step, ordinal, name
UNION ALL
SELECT $run AS run_id, step, ordinal, 'op' AS kind, name, sum(dur_ns) AS dur_ns,
       count(*) AS calls
FROM e WHERE lower(cat) IN ('cpu_op', 'operator')
GROUP BY step, ordinal, name;
