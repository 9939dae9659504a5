-- Group collectives matched across the ranks that took part, one row per (match, rank).
-- Matching key: (process group, sequence number) when every row of the source has one, else
-- (process group, op, step, occurrence in the step); a collective is matched only within its
-- own group (the trace's, else the one tracelab.derived.groups inferred). One source per run: the collector's
-- timings, else NCCL/RCCL kernels, else host annotations (gloo), whichever times the most
-- collectives on the most ranks.
CREATE TABLE IF NOT EXISTS matched_collectives (
    -- The run.
    run_id INTEGER NOT NULL,
    -- The matching key, unique within the run.
    match_key VARCHAR NOT NULL,
    -- A rank that took part.
    rank INTEGER NOT NULL,
    -- collectives.source the match comes from.
    source VARCHAR NOT NULL,
    -- Normalized op (all_reduce, all_gather, ...).
    op VARCHAR NOT NULL,
    -- Process group name; NULL when the trace does not say.
    pg_name VARCHAR,
    -- The group the match is within (process_groups.group_key): pg_name, else the group
    -- inferred for a collective whose trace names none (collective_groups); NULL when neither.
    group_key VARCHAR,
    -- The group's parallel dimension (process_groups.dim); 'unknown' when no group is known.
    dim VARCHAR NOT NULL,
    -- The step of the match (the lowest any rank put it in); NULL outside steps.
    step INTEGER,
    -- Arrival: start of this rank's operation.
    start_ns BIGINT NOT NULL,
    -- End of this rank's operation.
    end_ns BIGINT NOT NULL,
    -- end_ns - start_ns.
    dur_ns BIGINT NOT NULL,
    -- Message size as nccl-tests counts it: the whole buffer (all-gather: the gathered output;
    -- reduce-scatter: the whole input; others: the input); NULL when unknown.
    bytes BIGINT,
    -- Ranks in the process group (the trace's group size, else the ranks matched): the n of
    -- the bus-bandwidth factors.
    group_size INTEGER NOT NULL,
    -- Ranks in the match.
    ranks INTEGER NOT NULL,
    -- The data movement itself: from the last effective arrival (a rank's arrival, or the end
    -- of its earlier collectives of the group when later) to the first end, plus twice the
    -- largest clock uncertainty of the match's ranks; at most the shortest duration of the
    -- match (the TensorBoard plugin's "data transfer time", also the value when a clock is
    -- unbounded), at least 0. A late rank's collectives queued behind its own earlier ones
    -- and its lateness do not count.
    transfer_ns BIGINT NOT NULL,
    -- dur_ns - transfer_ns: this rank waiting for its peers (the plugin's "synchronizing time"),
    -- or queued behind its own earlier collectives.
    wait_ns BIGINT NOT NULL,
    -- The rank that arrived last: the one every other rank waited for (the lowest such rank
    -- when several arrived at the same instant).
    last_rank INTEGER NOT NULL,
    -- The last arrival.
    last_arrival_ns BIGINT NOT NULL,
    -- The last arrival minus the second-last: how late the last rank was (0 on this row unless
    -- rank = last_rank).
    lateness_ns BIGINT NOT NULL,
    -- events.idx of the event the row came from; NULL for collector/flight-recorder rows.
    event_idx BIGINT
);

INSERT INTO matched_collectives BY NAME
-- The matches of keyed_collectives (tracelab.derived.collectives.keyed_sql), aligned to the
-- reference clock: its rows of the run and source, made once per derive pass into the temp
-- table _tl_keyed (tracelab.derived.collectives.keyed). Parameters: $run, $source.
WITH x AS (FROM _tl_keyed),
m0 AS (SELECT x.*, ref_ns(x.start_ns, o.o) AS a_ns, ref_ns(x.end_ns, o.o) AS e_ns, e.stream,
              u.uncertainty_ns
       FROM x JOIN run_offsets($run) o ON o.rank = x.rank
       JOIN clock_offsets u ON u.run_id = $run AND u.rank = x.rank
       -- (a device collective's event is a communication kernel: the filter keeps the join's
       -- side of the events to those, not every kernel of the run)
       LEFT JOIN events e ON e.run_id = $run AND e.rank = x.rank AND e.idx = x.event_idx
            AND e.on_device AND e.category = 'communication'),
-- Effective arrival: the later of a rank's arrival and the ends of its earlier collectives of
-- the same group (docs/metrics.md): gloo runs a group's works on a few worker threads of its
-- own, so a late rank's later collectives start while its earlier ones still run; a device
-- stream serializes its own kernels, so there the group's collectives on other streams are
-- not waited for.
m AS (SELECT m0.*,
             greatest(a_ns, coalesce(max(e_ns) OVER (
                 PARTITION BY rank, coalesce(group_key, pg_name, ''), stream ORDER BY a_ns, key
                 ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), a_ns)) AS eff_ns
      FROM m0),
-- Data movement: from the last effective arrival to the first end, widened by the clocks'
-- uncertainty (twice the largest of the match's ranks: no wider than any two clocks may
-- disagree), at most the shortest duration; the shortest duration when a clock is unbounded.
l AS (SELECT key, max(a_ns) AS last_arrival_ns, arg_max(rank, [a_ns, -rank]) AS last_rank,
             CASE WHEN bool_and(uncertainty_ns IS NOT NULL)
                  THEN greatest(0, least(min(transfer_ns),
                                         min(e_ns) - max(eff_ns) + 2 * max(uncertainty_ns)))
                  ELSE min(transfer_ns) END AS moved_ns
      FROM m GROUP BY key),
s AS (SELECT m.key, max(m.a_ns) AS second_ns
      FROM m JOIN l USING (key) WHERE m.rank <> l.last_rank GROUP BY m.key)
SELECT $run AS run_id, m.key AS match_key, m.rank, $source AS source, m.op, m.pg_name,
       m.group_key, coalesce(pg.dim, 'unknown') AS dim, m.step,
       m.a_ns AS start_ns, m.e_ns AS end_ns,
       m.end_ns - m.start_ns AS dur_ns, m.bytes, m.group_size, m.matched AS ranks,
       l.moved_ns AS transfer_ns, (m.end_ns - m.start_ns) - l.moved_ns AS wait_ns, l.last_rank,
       l.last_arrival_ns,
       CASE WHEN m.rank = l.last_rank THEN l.last_arrival_ns - s.second_ns ELSE 0 END
           AS lateness_ns,
       m.event_idx
FROM m JOIN l USING (key) LEFT JOIN s USING (key)
LEFT JOIN process_groups pg ON pg.run_id = $run AND pg.group_key = m.group_key;
