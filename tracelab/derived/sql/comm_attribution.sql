-- Exposed communication split by the operation behind it and its parallel dimension: each 'transfer', 'wait' and
-- 'pipeline' segment of time_parts, shared among the communication intervals that cover it, in
-- proportion to their overlap with it. Per (rank, step, part) the rows add up to that part's
-- time in step_parts when every segment of it lies under communication ('pipeline' time with
-- nothing to do has no row).
CREATE TABLE IF NOT EXISTS comm_attribution (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The rank.
    rank INTEGER NOT NULL,
    -- The step.
    step INTEGER NOT NULL,
    -- 'transfer', 'wait' or 'pipeline' (time_parts.part).
    part VARCHAR NOT NULL,
    -- The operation (all_reduce, send, recv, ...; 'unknown' when the trace does not say).
    op VARCHAR NOT NULL,
    -- Its process group, when known.
    pg_name VARCHAR,
    -- Its parallel dimension (process_groups.dim of its group; 'pp' for send/recv; 'unknown'
    -- when no group is known): per (rank, step, part) the rows of every dim add up as above.
    dim VARCHAR NOT NULL,
    -- Its message size (matched_collectives.bytes; an all-to-all's, the call's size,
    -- all_to_all_ranks.call_bytes, as its bandwidth is measured), when known.
    bytes BIGINT,
    -- For 'wait': the rank that arrived last (whom this rank waited for); for 'pipeline': the
    -- peer of the send/recv, when known; NULL otherwise.
    culprit_rank INTEGER,
    -- Exposed time.
    exposed_ns BIGINT NOT NULL
);

INSERT INTO comm_attribution BY NAME
-- Each exposed segment shared among the communication intervals of its part that cover it
-- (Arrow table _tl_comm: rank, t0, t1, op, pg_name, bytes, culprit, dim, part), of a batch of
-- ranks (Arrow table _tl_parts: its time_parts rows). Parameters: $run.
WITH seg AS (
    SELECT rank, step, start_ns, end_ns, part FROM _tl_parts
    WHERE part IN ('transfer', 'wait', 'pipeline')
),
ov AS (
    SELECT seg.rank, seg.step, seg.part, seg.start_ns, seg.end_ns - seg.start_ns AS len,
           coalesce(iv.op, 'unknown') AS op, iv.pg_name, iv.bytes, iv.culprit,
           coalesce(iv.dim, 'unknown') AS dim,
           least(seg.end_ns, iv.t1) - greatest(seg.start_ns, iv.t0) AS ov
    FROM seg JOIN _tl_comm iv ON iv.rank = seg.rank AND iv.part = seg.part
         AND iv.t0 < seg.end_ns AND iv.t1 > seg.start_ns
),
tot AS (SELECT rank, start_ns, sum(ov) AS s FROM ov GROUP BY rank, start_ns)
SELECT $run AS run_id, ov.rank, ov.step, ov.part, ov.op, ov.pg_name, ov.dim, ov.bytes,
       ov.culprit AS culprit_rank,
       -- In DOUBLE: the product of two durations overflows BIGINT past about 3 s each (a
       -- collective that waits out a timeout).
       round(sum(ov.len::DOUBLE * ov.ov / tot.s))::BIGINT AS exposed_ns
FROM ov JOIN tot USING (rank, start_ns)
GROUP BY ov.rank, ov.step, ov.part, ov.op, ov.pg_name, ov.dim, ov.bytes, ov.culprit;
