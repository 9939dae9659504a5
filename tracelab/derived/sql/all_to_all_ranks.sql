-- All-to-all calls, one row per (call, rank): the bytes each rank sent and received, and the
-- call's skew (docs/metrics.md, "All-to-all"). The rows are the run's timed all-to-alls of the
-- collective source matched_collectives uses; a call matched across ranks has its match_key
-- and the per-call columns, one seen on a single rank (a one-rank trace) has them NULL.
-- Bytes come, first found, from the split sizes the trace records (`In split size`/`Out split
-- size` of the NCCL kernel or its `record_param_comms`; the split lists in `Concrete Inputs` of
-- `c10d::alltoall_base_`), else from the input and output tensors' `Input Dims` and dtype
-- (`c10d::alltoall_base_`; the `nccl:all_to_all`/`gloo:all_to_all` annotation gives the sent
-- side only), else from the collectives row (the collector's record of the call).
CREATE TABLE IF NOT EXISTS all_to_all_ranks (
    -- The run.
    run_id INTEGER NOT NULL,
    -- matched_collectives.match_key of the call; NULL when the call is matched on no other rank.
    match_key VARCHAR,
    -- The call: match_key, else 'rank R #K' (the rank's K-th all-to-all of the run, from 0).
    call_key VARCHAR NOT NULL,
    -- The rank.
    rank INTEGER NOT NULL,
    -- The step of the call (the match's when matched, else the row's own).
    step INTEGER,
    -- Start of this rank's operation (reference clock).
    start_ns BIGINT NOT NULL,
    -- End of this rank's operation (reference clock).
    end_ns BIGINT NOT NULL,
    -- Ranks in the process group (the match's, else the trace's); NULL when unknown.
    group_size INTEGER,
    -- Bytes this rank sent (its input buffer, the chunk it keeps for itself included); NULL
    -- when unknown.
    sent_bytes BIGINT,
    -- Bytes this rank received (its output buffer); NULL when unknown.
    recv_bytes BIGINT,
    -- Bytes sent to each rank of the group, in group-rank order: from the split sizes the
    -- trace gives, else from the collector's record (collectives.in_split_bytes); NULL when
    -- neither (an even all-to-all's trace records empty split lists).
    sent_to_bytes BIGINT[],
    -- Bytes received from each rank of the group, like sent_to_bytes.
    recv_from_bytes BIGINT[],
    -- Where the bytes come from: 'split_sizes', 'input_dims', 'record' (the collectives row),
    -- or NULL when no size is known.
    bytes_from VARCHAR,
    -- Per call (NULL unless matched): max / mean of sent_bytes over the call's ranks (1 = even).
    sent_skew DOUBLE,
    -- Per call: max / mean of recv_bytes over the call's ranks.
    recv_skew DOUBLE,
    -- Per call: the rank that sent the most bytes (the lowest such rank on a tie).
    top_sender INTEGER,
    -- Per call: the rank that received the most bytes (the lowest such rank on a tie).
    top_receiver INTEGER,
    -- Per call: the busiest rank's bytes, max over ranks of greatest(sent, received): the
    -- buffer that bounds the call, nccl-tests' all-to-all size for an even call.
    call_bytes BIGINT,
    -- Per call: matched_collectives.transfer_ns (the shortest duration over its ranks).
    transfer_ns BIGINT,
    -- Per call: bus bandwidth (GB/s) by nccl-tests' all-to-all convention:
    -- call_bytes / transfer_ns x (n - 1) / n, n = group_size.
    busbw_gbps DOUBLE,
    -- Per call: the rank that arrived last (matched_collectives.last_rank).
    last_rank INTEGER,
    -- This rank's wait for the last arrival (matched_collectives.wait_ns); NULL unless matched.
    wait_ns BIGINT
);

INSERT INTO all_to_all_ranks BY NAME
-- Parameters: $run, $source (the matched source, tracelab.derived.collectives.choose_source).
-- Arrow table _tl_dtype_bytes (name, bytes): bytes per element of a lower-cased type name.
-- A call's host time (issue_ns): its kernel's launch (the host event of the same correlation)
-- when the call is device work, else its start. The CPU runs ahead of the GPU: a kernel may
-- start after later calls were issued, so a kernel's start would take a later call's sizes.
WITH launch AS (
    SELECT cc.rank, cc.event_idx, min(l.ts_ns) AS ts_ns
    FROM collectives cc
    JOIN events k ON k.run_id = $run AND k.rank = cc.rank AND k.idx = cc.event_idx
         AND k.on_device
    JOIN events l ON l.run_id = $run AND l.rank = k.rank AND l.correlation = k.correlation
         AND NOT l.on_device
    WHERE cc.run_id = $run AND cc.source = $source AND cc.op = 'all_to_all'
    GROUP BY cc.rank, cc.event_idx
),
c0 AS (
    SELECT cc.*, coalesce(l.ts_ns, cc.start_ns) AS issue_ns
    FROM collectives cc LEFT JOIN launch l ON l.rank = cc.rank AND l.event_idx = cc.event_idx
    WHERE cc.run_id = $run AND cc.source = $source AND cc.op = 'all_to_all'
      AND cc.start_ns IS NOT NULL AND cc.end_ns IS NOT NULL
),
c AS (
    SELECT c0.rank, c0.start_ns, c0.end_ns, c0.step, c0.in_bytes, c0.out_bytes, c0.group_size,
           c0.event_idx, c0.issue_ns, c0.in_split_bytes AS rec_ins,
           c0.out_split_bytes AS rec_outs,
           coalesce(lag(c0.issue_ns) OVER (PARTITION BY c0.rank ORDER BY c0.issue_ns),
                    -9223372036854775807) AS prev_ns,
           row_number() OVER (PARTITION BY c0.rank ORDER BY c0.start_ns) - 1 AS occ
    FROM c0
),
-- Host events that describe an all-to-all's sizes, normalized: totals in bytes and split lists.
h0 AS (
    SELECT e.rank, e.idx, e.ts_ns, e.name, e.args,
           regexp_replace(lower(json_extract_string(e.args, '$.dtype')), '^c10d::', '') AS rp_t,
           TRY_CAST(json_extract(e.args, '$."Input Dims"') AS BIGINT[][]) AS dims,
           TRY_CAST(json_extract(e.args, '$."Input type"') AS VARCHAR[]) AS types,
           TRY_CAST(json_extract(e.args, '$."Concrete Inputs"') AS VARCHAR[]) AS conc
    FROM events e
    WHERE e.run_id = $run AND NOT e.on_device
      AND (e.name = 'c10d::alltoall_base_'
           OR (e.name = 'record_param_comms'
               AND regexp_matches(lower(json_extract_string(e.args, '$."Collective name"')),
                                  'all_{0,1}to_{0,1}all'))
           OR regexp_matches(e.name, '^(nccl|gloo|rccl|hccl):all_{0,1}to_{0,1}all'))
),
h AS (
    SELECT h0.rank, h0.ts_ns,
           CASE WHEN h0.name = 'c10d::alltoall_base_' THEN 'split_op'
                WHEN h0.name = 'record_param_comms' THEN 'param_comms'
                ELSE 'annotation' END AS kind,
           CASE WHEN h0.name = 'record_param_comms'
                THEN TRY_CAST(json_extract_string(h0.args, '$."In msg nelems"') AS BIGINT) * rb.bytes
                WHEN h0.name = 'c10d::alltoall_base_'
                THEN list_product(h0.dims[2])::BIGINT * tin.bytes
                -- gloo's annotation lists every input tensor: one for all_to_all_single, one
                -- per peer for the list form (dist.all_to_all), all of them sent.
                WHEN h0.name LIKE 'gloo:%'
                THEN list_sum(list_transform(h0.dims, lambda d: list_product(d)))::BIGINT * tin1.bytes
                ELSE list_product(h0.dims[1])::BIGINT * tin1.bytes END AS in_total,
           CASE WHEN h0.name = 'record_param_comms'
                THEN TRY_CAST(json_extract_string(h0.args, '$."Out msg nelems"') AS BIGINT) * rb.bytes
                WHEN h0.name = 'c10d::alltoall_base_'
                THEN list_product(h0.dims[1])::BIGINT * tout.bytes END AS out_total,
           CASE WHEN h0.name = 'record_param_comms'
                THEN TRY_CAST(json_extract_string(h0.args, '$."In split size"') AS BIGINT[])
                WHEN h0.name = 'c10d::alltoall_base_' THEN TRY_CAST(h0.conc[5] AS BIGINT[])
                END AS in_splits,
           CASE WHEN h0.name = 'record_param_comms'
                THEN TRY_CAST(json_extract_string(h0.args, '$."Out split size"') AS BIGINT[])
                WHEN h0.name = 'c10d::alltoall_base_' THEN TRY_CAST(h0.conc[4] AS BIGINT[])
                END AS out_splits
    FROM h0
    LEFT JOIN _tl_dtype_bytes rb ON rb.name = h0.rp_t
    LEFT JOIN _tl_dtype_bytes tin
        ON tin.name = regexp_replace(lower(h0.types[2]), '^c10d::', '')
    LEFT JOIN _tl_dtype_bytes tout
        ON tout.name = regexp_replace(lower(h0.types[1]), '^c10d::', '')
    LEFT JOIN _tl_dtype_bytes tin1
        ON tin1.name = regexp_replace(lower(h0.types[1]), '^c10d::', '')
),
-- Each call's describing events: the last of each kind at or before its issue_ns, and after
-- the rank's previous all-to-all's (so a call never takes another call's sizes).
sp AS (SELECT * FROM h WHERE kind = 'split_op'),
pc AS (SELECT * FROM h WHERE kind = 'param_comms'),
an AS (SELECT * FROM h WHERE kind = 'annotation'),
j AS (
    SELECT c.*,
           CASE WHEN sp.ts_ns > c.prev_ns THEN sp.in_total END AS sp_in,
           CASE WHEN sp.ts_ns > c.prev_ns THEN sp.out_total END AS sp_out,
           CASE WHEN sp.ts_ns > c.prev_ns THEN sp.in_splits END AS sp_ins,
           CASE WHEN sp.ts_ns > c.prev_ns THEN sp.out_splits END AS sp_outs
    FROM c ASOF LEFT JOIN sp ON sp.rank = c.rank AND sp.ts_ns <= c.issue_ns
),
j2 AS (
    SELECT j.*,
           CASE WHEN pc.ts_ns > j.prev_ns THEN pc.in_total END AS pc_in,
           CASE WHEN pc.ts_ns > j.prev_ns THEN pc.out_total END AS pc_out,
           CASE WHEN pc.ts_ns > j.prev_ns THEN pc.in_splits END AS pc_ins,
           CASE WHEN pc.ts_ns > j.prev_ns THEN pc.out_splits END AS pc_outs
    FROM j ASOF LEFT JOIN pc ON pc.rank = j.rank AND pc.ts_ns <= j.issue_ns
),
j3 AS (
    SELECT j2.*, CASE WHEN an.ts_ns > j2.prev_ns THEN an.in_total END AS an_in
    FROM j2 ASOF LEFT JOIN an ON an.rank = j2.rank AND an.ts_ns <= j2.issue_ns
),
-- The call's own event (an NCCL kernel) may carry the split sizes itself.
own AS (
    SELECT j3.*,
           TRY_CAST(json_extract_string(e.args, '$."In msg nelems"') AS BIGINT) * ob.bytes
               AS own_in,
           TRY_CAST(json_extract_string(e.args, '$."Out msg nelems"') AS BIGINT) * ob.bytes
               AS own_out,
           TRY_CAST(json_extract_string(e.args, '$."In split size"') AS BIGINT[]) AS own_ins,
           TRY_CAST(json_extract_string(e.args, '$."Out split size"') AS BIGINT[]) AS own_outs
    FROM j3
    LEFT JOIN events e ON e.run_id = $run AND e.rank = j3.rank AND e.idx = j3.event_idx
    LEFT JOIN _tl_dtype_bytes ob
        ON ob.name = regexp_replace(lower(json_extract_string(e.args, '$.dtype')), '^c10d::', '')
),
-- The first source with a total, and its split lists (empty lists: an even call).
pick AS (
    SELECT *,
           CASE WHEN own_in IS NOT NULL THEN 'own' WHEN pc_in IS NOT NULL THEN 'pc'
                WHEN sp_in IS NOT NULL THEN 'sp' WHEN an_in IS NOT NULL THEN 'an'
                WHEN in_bytes IS NOT NULL OR out_bytes IS NOT NULL THEN 'rec' END AS via
    FROM own
),
b AS (
    SELECT *,
           CASE via WHEN 'own' THEN own_in WHEN 'pc' THEN pc_in WHEN 'sp' THEN sp_in
                    WHEN 'an' THEN an_in WHEN 'rec' THEN in_bytes END AS s_bytes,
           CASE via WHEN 'own' THEN own_out WHEN 'pc' THEN pc_out WHEN 'sp' THEN sp_out
                    WHEN 'rec' THEN out_bytes END AS r_bytes,
           CASE via WHEN 'own' THEN own_ins WHEN 'pc' THEN pc_ins WHEN 'sp' THEN sp_ins END
               AS ins,
           CASE via WHEN 'own' THEN own_outs WHEN 'pc' THEN pc_outs WHEN 'sp' THEN sp_outs END
               AS outs
    FROM pick
),
r AS (
    SELECT b.rank, b.start_ns, b.end_ns, b.step, b.occ, b.s_bytes, b.r_bytes,
           b.group_size AS trace_group_size,
           -- bytes per peer: the split's share of the total (splits count rows of dim 0); where
           -- the trace gives no split list, the collector's record of the call (its bytes per
           -- peer) when they add up to the total
           CASE WHEN len(b.ins) > 0 AND list_sum(b.ins) > 0 AND b.s_bytes IS NOT NULL
                THEN list_transform(b.ins, lambda x: round(b.s_bytes * x / list_sum(b.ins))::BIGINT)
                WHEN len(b.rec_ins) > 0 AND list_sum(b.rec_ins) = b.s_bytes THEN b.rec_ins
                END AS sent_to,
           CASE WHEN len(b.outs) > 0 AND list_sum(b.outs) > 0 AND b.r_bytes IS NOT NULL
                THEN list_transform(b.outs, lambda x: round(b.r_bytes * x / list_sum(b.outs))::BIGINT)
                WHEN len(b.rec_outs) > 0 AND list_sum(b.rec_outs) = b.r_bytes THEN b.rec_outs
                END AS recv_from,
           CASE WHEN b.via IS NULL THEN NULL
                WHEN b.via = 'rec' THEN 'record'
                WHEN len(b.ins) > 0 OR len(b.outs) > 0 THEN 'split_sizes'
                WHEN b.via = 'sp' OR b.via = 'an' THEN 'input_dims'
                ELSE 'split_sizes' END AS bytes_from
    FROM b
),
-- Matched calls: the row's match through its aligned start on the same rank.
m AS (
    SELECT r.*, ref_ns(r.start_ns, o.o) AS a_ns, ref_ns(r.end_ns, o.o) AS e_ns
    FROM r JOIN run_offsets($run) o ON o.rank = r.rank
),
mm AS (
    SELECT m.*, mc.match_key, mc.step AS m_step, mc.group_size AS m_n, mc.transfer_ns,
           mc.last_rank, mc.wait_ns
    FROM m LEFT JOIN matched_collectives mc
        ON mc.run_id = $run AND mc.rank = m.rank AND mc.op = 'all_to_all'
       AND mc.start_ns = m.a_ns AND mc.end_ns = m.e_ns
),
per_call AS (
    SELECT match_key,
           -- NULL when nothing moved (DuckDB's 0 / 0.0 is NaN, which no JSON can hold)
           max(s_bytes) / nullif(avg(s_bytes), 0) AS sent_skew,
           max(r_bytes) / nullif(avg(r_bytes), 0) AS recv_skew,
           arg_max(rank, [s_bytes, -rank]) FILTER (WHERE s_bytes IS NOT NULL) AS top_sender,
           arg_max(rank, [r_bytes, -rank]) FILTER (WHERE r_bytes IS NOT NULL) AS top_receiver,
           max(greatest(s_bytes, r_bytes)) AS call_bytes,
           any_value(m_n) AS n
    FROM mm WHERE match_key IS NOT NULL GROUP BY match_key
)
SELECT $run AS run_id, mm.match_key,
       coalesce(mm.match_key, concat('rank ', mm.rank, ' #', mm.occ)) AS call_key,
       mm.rank, coalesce(mm.m_step, mm.step) AS step, mm.a_ns AS start_ns, mm.e_ns AS end_ns,
       coalesce(mm.m_n, mm.trace_group_size) AS group_size,
       mm.s_bytes AS sent_bytes, mm.r_bytes AS recv_bytes, mm.sent_to AS sent_to_bytes,
       mm.recv_from AS recv_from_bytes, mm.bytes_from,
       pc.sent_skew, pc.recv_skew, pc.top_sender, pc.top_receiver, pc.call_bytes,
       mm.transfer_ns,
       CASE WHEN mm.transfer_ns > 0 AND pc.n > 0
            THEN pc.call_bytes / mm.transfer_ns * (pc.n - 1) / pc.n END AS busbw_gbps,
       mm.last_rank, mm.wait_ns
FROM mm LEFT JOIN per_call pc USING (match_key);
