-- Macros the derived definitions share (one definition each; tracelab.derived.sqlfiles creates
-- them, as temporary macros, on the connection that derives). These read no table; those that
-- read the store's tables are in _store_macros.sql.

-- Event time on the reference clock: a rank's own time minus its clock_offsets.offset_ns
-- (docs/metrics.md, "Clocks"). Every derived time on the reference clock goes through this.
CREATE OR REPLACE TEMP MACRO ref_ns(own_ns, offset_ns) AS own_ns - offset_ns;

-- The union of intervals: the merged intervals of the relation named `src` (columns k, t0,
-- t1; k any key, a STRUCT for several) per k: sort by start, running max of end, a new group
-- when a start is past the running max. Intervals are half-open [t0, t1) in ns; touching
-- intervals merge (HTA's merge_kernel_intervals); empty ones (t1 <= t0) are dropped.
-- tracelab.derived.intervals.union is this definition in numpy, for whole runs (tested equal).
CREATE OR REPLACE TEMP MACRO interval_union(src) AS TABLE
    SELECT k, min(t0) AS t0, max(t1) AS t1
    FROM (
        SELECT k, t0, t1,
               sum(CASE WHEN t0 > _prev_end THEN 1 ELSE 0 END)
                   OVER (PARTITION BY k ORDER BY t0, t1 ROWS UNBOUNDED PRECEDING) AS _grp
        FROM (
            SELECT k, t0, t1,
                   coalesce(max(t1) OVER (PARTITION BY k ORDER BY t0, t1
                                          ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING),
                            -9223372036854775807) AS _prev_end
            FROM query_table(src) WHERE t1 > t0
        )
    )
    GROUP BY k, _grp;

-- A communication event's op in tracelab's vocabulary: the op of the first rule whose pattern
-- matches the name lower-cased without underscores, else 'unknown' (the rules are
-- tracelab.vocabulary.OP_RULES, bound as the lists `patterns` and `ops`; the same rules as
-- the ingest's op_sql).
CREATE OR REPLACE TEMP MACRO collective_op(name, patterns, ops) AS
    coalesce(ops[list_position(
        list_transform(patterns, lambda p: regexp_matches(replace(lower(name), '_', ''), p)),
        true)], 'unknown');
