"""SQL of the timeline. Lane columns are coalesced (pid/tid -1, label '') so that lanes join
without NULL semantics; `timeline.py` maps them back to lane indices.

Parameters are named ($run, $a, ...) and bound through `tracelab.views._sql.bind`, which passes
each query only the names it uses. $a/$b bound the window on the aligned clock; $prune_lo and
$prune_hi bound it on the raw clock (widened by the offsets and the longest event) so that DuckDB
can skip row groups by their ts_ns min/max. $ranks and $cats filter (empty list = all).
"""

from __future__ import annotations

from tracelab.views._sql import OFFSETS

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
           count(*) FILTER (WHERE e.category = 'communication') AS comm_n
    FROM events e
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
SELECT l.rank, l.on_device, l.pid, l.tid, l.lbl, l.n, l.comm_n, pn.value, pn.labels, tn.value
FROM l
LEFT JOIN pn ON pn.rank = l.rank AND pn.pid = l.pid
LEFT JOIN tn ON tn.rank = l.rank AND tn.pid = l.pid AND tn.tid = l.tid
ORDER BY l.rank, l.on_device, l.pid, l.tid, l.lbl
"""

_VISIBLE = f"""
    FROM events e JOIN {OFFSETS} o USING (rank)
    WHERE e.run_id = $run AND e.ts_ns < $prune_hi AND e.ts_ns > $prune_lo
      AND e.ts_ns - o.off_ns < $b AND e.ts_ns - o.off_ns + e.dur_ns > $a {FILTERS}
"""

#: How many events overlap the window.
COUNT = "SELECT count(*)" + _VISIBLE

#: Raw events overlapping the window (the caller checks the count first), args cut to $args_chars.
RAW = (
    f"SELECT {LANE_SELECT}, e.idx, e.name, e.category, e.ts_ns - o.off_ns AS s, e.dur_ns, "
    "e.step, substr(CAST(e.args AS VARCHAR), 1, $args_chars) AS args"
    + _VISIBLE
    + " ORDER BY e.rank, e.on_device, pid, tid, lbl, s, e.dur_ns DESC LIMIT $limit"
)

#: Per lane and time bin ($w ns wide, $nbins of them): busy time (the union of intervals, so
#: nested host ops count once), event count, and the dominant category. Step annotations and
#: device-side annotations do not count as busy: they wrap work rather than being work.
AGGREGATE = f"""
WITH ev AS (
    SELECT {LANE_SELECT}, e.category,
           (e.category = 'annotation' AND (e.on_device OR e.name LIKE 'ProfilerStep#%')) AS wrapper,
           greatest(e.ts_ns - o.off_ns, $a) AS s,
           least(e.ts_ns - o.off_ns + e.dur_ns, $b) AS t
    {_VISIBLE}
),
prev AS (
    SELECT {LANE_COLS}, s, t,
           max(t) OVER (PARTITION BY {LANE_COLS} ORDER BY s, t
                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
    FROM ev WHERE NOT wrapper
),
island AS (
    SELECT {LANE_COLS}, s, t,
           sum(CASE WHEN prev_end IS NULL OR s > prev_end THEN 1 ELSE 0 END)
               OVER (PARTITION BY {LANE_COLS} ORDER BY s, t ROWS UNBOUNDED PRECEDING) AS grp
    FROM prev
),
merged AS (
    SELECT {LANE_COLS}, min(s) AS s, max(t) AS t FROM island GROUP BY {LANE_COLS}, grp
),
spread AS (
    SELECT {LANE_COLS}, s, t,
           unnest(range(CAST((s - $a) // $w AS BIGINT),
                        CAST((t - 1 - $a) // $w AS BIGINT) + 1)) AS bin
    FROM merged
),
busy AS (
    SELECT {LANE_COLS}, bin,
           sum(least(t, $a + (bin + 1) * $w) - greatest(s, $a + bin * $w)) AS busy_ns
    FROM spread GROUP BY ALL
),
per_cat AS (
    SELECT {LANE_COLS}, CAST((s - $a) // $w AS BIGINT) AS bin, category,
           count(*) AS n, sum(CASE WHEN wrapper THEN 0 ELSE t - s END) AS d
    FROM ev GROUP BY ALL
),
counts AS (
    SELECT {LANE_COLS}, bin, sum(n) AS n, arg_max(category, d) AS dominant
    FROM per_cat GROUP BY ALL
)
SELECT {LANE_COLS}, bin, coalesce(busy.busy_ns, 0) AS busy_ns, coalesce(counts.n, 0) AS n,
       counts.dominant
FROM busy FULL OUTER JOIN counts USING ({LANE_COLS}, bin)
WHERE bin >= 0 AND bin < $nbins
"""

#: Collectives matched across ranks (the analyzers' matching, tracelab.analyzers._collectives),
#: arriving inside the window, with the lane of the event each came from (NULL lane for the
#: collector's own records). Positional binds: the match query's (run, source, offsets), then
#: run, a, b, ranks filter (list), limit.
def collectives_sql(matched: str) -> str:
    return f"""
SELECT m.key, m.op, m.rank, m.a_ns, {LANE_SELECT.replace("e.", "ev.")}
FROM ({matched}) m
LEFT JOIN events ev ON ev.run_id = ? AND ev.rank = m.rank AND ev.idx = m.event_idx
WHERE m.a_ns >= ? AND m.a_ns <= ? AND (len(?::INTEGER[]) = 0 OR list_contains(?::INTEGER[], m.rank))
ORDER BY m.key, m.rank
LIMIT ?
"""


#: Step spans on the aligned clock, per step, over the chosen ranks.
STEPS = f"""
SELECT s.step, min(s.start_ns - o.off_ns) AS s,
       max(coalesce(s.device_end_ns, s.end_ns) - o.off_ns) AS t
FROM steps s JOIN {OFFSETS} o USING (rank)
WHERE s.run_id = $run AND (len($ranks) = 0 OR list_contains($ranks, s.rank))
GROUP BY s.step ORDER BY s.step
"""
