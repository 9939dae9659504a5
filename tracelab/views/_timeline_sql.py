"""SQL of the timeline. Lane columns are coalesced (pid/tid -1, label '') so that lanes join
without NULL semantics; `timeline.py` maps them back to lane indices.

Parameters are named ($run, $a, ...) and bound through `tracelab.views._sql.bind`, which passes
each query only the names it uses. $a/$b bound the window on the aligned clock; $prune_lo and
$prune_hi bound it on the raw clock (widened by the offsets and the longest event) so that DuckDB
can skip row groups by their ts_ns min/max. $ranks and $cats filter (empty list = all).
"""

from __future__ import annotations

from tracelab.views._sql import EVENTS, OFFSETS, PARTS

#: The lane key of an event, as columns (device events are laned by stream).
LANE_COLS = "rank, on_device, pid, tid, lbl"
LANE_SELECT = (
    "e.rank, e.on_device, coalesce(e.pid, -1) AS pid, "
    "coalesce(CASE WHEN e.on_device THEN e.stream END, e.tid, -1) AS tid, "
    "coalesce(e.lane_label, '') AS lbl"
)
FILTERS = (
    "AND (len($ranks) = 0 OR list_contains($ranks, e.rank)) "
    "AND (len($cats) = 0 OR list_contains($cats, e.category))"
)

#: Lanes of a run (with the filters but not the time window, so they stay put while zooming),
#: named from the trace's process/thread metadata.
LANES = f"""
WITH l AS (
    SELECT {LANE_SELECT}, count(*) AS n,
           count(*) FILTER (WHERE e.category = 'communication') AS comm_n,
           count(*) FILTER (WHERE e.category NOT IN ('annotation', 'other')) AS work_n,
           count(*) FILTER (WHERE e.name LIKE 'ProfilerStep#%') AS step_n
    FROM {EVENTS} e
    WHERE e.run_id = $run {FILTERS}
    GROUP BY ALL
),
pn AS (
    SELECT rank, pid,
           any_value(value) FILTER (WHERE kind = 'process_name') AS value,
           any_value(value) FILTER (WHERE kind = 'process_labels') AS labels
    FROM lanes
    WHERE run_id = $run AND kind IN ('process_name', 'process_labels') GROUP BY ALL
),
tn AS (
    SELECT rank, pid, tid, any_value(value) AS value FROM lanes
    WHERE run_id = $run AND kind = 'thread_name' GROUP BY ALL
)
SELECT l.rank, l.on_device, l.pid, l.tid, l.lbl, l.n, l.comm_n, pn.value, pn.labels, tn.value,
       l.work_n, l.step_n
FROM l
LEFT JOIN pn ON pn.rank = l.rank AND pn.pid = l.pid
LEFT JOIN tn ON tn.rank = l.rank AND tn.pid = l.pid AND tn.tid = l.tid
ORDER BY l.rank, l.on_device, l.pid, l.tid, l.lbl
"""

#: Events overlapping the window. Two scans: events starting at most $long_ns before the window
#: (DuckDB skips row groups by ts_ns min/max), plus the few longer events that start earlier.
_VISIBLE = f"""
    FROM (
        SELECT * FROM {EVENTS}
        WHERE run_id = $run AND ts_ns > $prune_lo AND ts_ns < $prune_hi
        UNION ALL
        SELECT * FROM {EVENTS}
        WHERE run_id = $run AND dur_ns > $long_ns AND ts_ns <= $prune_lo
    ) e JOIN {OFFSETS} o USING (rank)
    WHERE e.ts_ns - o.off_ns < $b AND e.ts_ns - o.off_ns + e.dur_ns > $a {FILTERS}
"""

#: How many events overlap the window.
COUNT = "SELECT count(*)" + _VISIBLE

#: Raw events overlapping the window (the caller checks the count first), args cut to $args_chars.
RAW = (
    f"SELECT {LANE_SELECT}, e.idx, e.name, e.category, e.ts_ns - o.off_ns AS s, e.dur_ns, "
    "e.step, substr(CAST(e.args AS VARCHAR), 1, $args_chars) AS args"
    + _VISIBLE
    + " ORDER BY e.rank, e.on_device, pid, tid, lbl, s, e.dur_ns DESC, e.idx LIMIT $limit"
)

#: The visible events for binning: lane index (joined from the lanes the caller lists in
#: $l_* parallel lists), start and end clipped to the window, and whether the event only wraps
#: work (step annotations, device-side annotations: not counted as busy). Unsorted: the caller
#: sorts (numpy's stable sort exploits the store's (rank, ts) order; DuckDB's ORDER BY does not).
BINNABLE = f"""
WITH lanes AS (
    SELECT unnest($l_rank::INTEGER[]) AS rank, unnest($l_dev::BOOLEAN[]) AS on_device,
           unnest($l_pid::BIGINT[]) AS pid, unnest($l_tid::BIGINT[]) AS tid,
           unnest($l_lbl::VARCHAR[]) AS lbl, unnest($l_idx::BIGINT[]) AS lane
),
ev AS (
    SELECT {LANE_SELECT},
           (e.category = 'annotation' AND (e.on_device OR e.name LIKE 'ProfilerStep#%')) AS wrapper,
           CASE WHEN e.category = 'compute' THEN 0 WHEN e.category = 'communication' THEN 1
                WHEN e.category IN ('memcpy', 'memset') THEN 2
                WHEN e.category IN ('cpu_op', 'runtime', 'sync', 'python') THEN 3
                ELSE 4 END AS grp,
           greatest(e.ts_ns - o.off_ns, $a) AS s,
           least(e.ts_ns - o.off_ns + e.dur_ns, $b) AS t
    {_VISIBLE}
)
SELECT lanes.lane, ev.s, ev.t, ev.wrapper, ev.grp
FROM ev JOIN lanes USING ({LANE_COLS})
"""


#: Collectives matched across ranks (the derived layer's matched_collectives, reference clock)
#: arriving inside the window, with the lane key of the event each came from (NULL for the
#: collector's own records).
LINKS = f"""
SELECT m.match_key, m.op, m.rank, m.start_ns, {LANE_SELECT.replace("e.", "ev.")}
FROM matched_collectives m
LEFT JOIN {EVENTS} ev ON ev.run_id = m.run_id AND ev.rank = m.rank AND ev.idx = m.event_idx
WHERE m.run_id = $run AND m.start_ns >= $a AND m.start_ns <= $b
  AND (len($ranks) = 0 OR list_contains($ranks, m.rank))
ORDER BY m.match_key, m.rank
LIMIT $limit
"""

#: Step spans (step_spans: the steps every surface counts, reference clock), per step, over
#: the chosen ranks.
STEPS = """
SELECT step, min(start_ns) AS s, max(end_ns) AS t
FROM step_spans
WHERE run_id = $run AND (len($ranks) = 0 OR list_contains($ranks, rank))
GROUP BY step ORDER BY step
"""

#: The lost-time model's segments (time_parts) overlapping the window, clipped to it.
_PARTS_WHERE = f"""
FROM {PARTS}
WHERE run_id = $run AND start_ns < $b AND end_ns > $a
  AND (len($ranks) = 0 OR list_contains($ranks, rank))
  AND (len($steps) = 0 OR list_contains($steps, step))
"""
PARTS_COUNT = "SELECT count(*)" + _PARTS_WHERE
PARTS_ROWS = (
    "SELECT rank, greatest(start_ns, $a) AS s, least(end_ns, $b) AS t, part"
    + _PARTS_WHERE
    + " ORDER BY rank, s LIMIT $limit"
)
#: Ranks that have lost-time segments at all (they get a "time" lane).
PARTS_RANKS = """
SELECT DISTINCT rank FROM step_parts
WHERE run_id = $run AND (len($ranks) = 0 OR list_contains($ranks, rank)) ORDER BY rank
"""
#: The same segments for binning: the rank's position in $r_ranks and the part's index in
#: $names (0-based), start and end clipped to the window; unsorted.
PARTS_BINNABLE = (
    "SELECT list_position($r_ranks, rank) - 1 AS pos, "
    "coalesce(list_position($names, part), len($names)) - 1 AS pidx, "
    "greatest(start_ns, $a) AS s, least(end_ns, $b) AS t" + _PARTS_WHERE
)
