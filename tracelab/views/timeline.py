"""The timeline, by level of detail: raw events when few are visible, per-lane time bins otherwise.

The browser never receives more than a bounded number of shapes: at most RAW_EVENT_LIMIT event
bars, or at most MAX_CELLS aggregate cells (lanes x bins), plus at most MAX_LINKS collective
links and MAX_STEP_MARKS step markers. DuckDB filters and sorts the visible events and numpy bins
them (`_bins`), so a zoom over a million events costs one scan and a sort, and only the bins
travel to the browser.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

import duckdb
import numpy as np

from tracelab.views import _bins
from tracelab.views import _timeline_sql as sql
from tracelab.views._sql import EVENTS, bind, query, scoped
from tracelab.views.context import RunContext
from tracelab.vocabulary import TIME_PARTS

#: Above this many visible events, the timeline shows aggregates.
RAW_EVENT_LIMIT = 1500
#: Most aggregate cells (lanes x bins) sent at once.
MAX_CELLS = 24_000
#: Most time bins per lane (about one per two pixels of a wide plot).
MAX_BINS = 800
#: Most collective matches drawn across ranks.
MAX_LINKS = 300
#: Collective matches are looked up only when at most this many events are visible: zoomed
#: out further, they would be an unreadable hatch (and cost a query per zoom).
LINKS_EVENT_LIMIT = 100_000
#: Most step markers drawn.
MAX_STEP_MARKS = 200
#: Events longer than this are looked up apart, so that the time-window scan stays narrow.
LONG_EVENT_NS = 10_000_000
#: Characters of an event's args shown on hover (the detail panel shows them all).
ARGS_CHARS = 80
#: Most lost-time segments drawn one by one in a window (more: stacked shares per bin).
MAX_PART_SEGMENTS = 3000
#: Sub-rows of a rank's "time" lane when aggregated: each bin is a stacked column of the parts'
#: shares at this resolution (10: one sub-row per 10% of the bin).
PART_SUBROWS = 10
#: The lost-time model's parts as time_parts labels them, in stacking order.
#: What event lanes are busy with when aggregated (the `grp` of _timeline_sql.BINNABLE).
EVENT_GROUPS = ("compute", "communication", "memcpy", "host ops", "annotations")

LaneKey = tuple[int, bool, int, int, str]


@dataclass(frozen=True, kw_only=True)
class Lane:
    """One row of the timeline: a host thread or a device stream of one rank."""

    index: int
    rank: int
    on_device: bool
    pid: int | None
    tid: int | None
    #: Human label, raw text from the trace: renderers must escape it.
    label: str
    event_count: int
    #: Communication events on the lane (the lane that draws the rank's collective matches).
    comm_count: int = 0
    #: The trace's string pid/tid for lanes that had no numeric ids ('' otherwise).
    lane_label: str = ""
    #: The rank's main thread (the host lane holding its ProfilerStep spans, else the busiest).
    main: bool = False

    @property
    def key(self) -> LaneKey:
        return (
            self.rank,
            self.on_device,
            -1 if self.pid is None else self.pid,
            -1 if self.tid is None else self.tid,
            self.lane_label,
        )


@dataclass(frozen=True, kw_only=True)
class TimelineRequest:
    """What the user asked to see. Times in ms since the run's first event; None = whole run."""

    t0_ms: float | None = None
    t1_ms: float | None = None
    ranks: tuple[int, ...] = ()
    steps: tuple[int, ...] = ()
    categories: tuple[str, ...] = ()
    #: Plot width in pixels: the number of bins follows it.
    width_px: int = 1200


@dataclass(frozen=True, kw_only=True)
class RawEvents:
    """Columns of the visible events, one entry per event."""

    lane: list[int] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    rank: list[int] = field(default_factory=list)
    idx: list[int] = field(default_factory=list)
    name: list[str] = field(default_factory=list)
    category: list[str] = field(default_factory=list)
    start_ms: list[float] = field(default_factory=list)
    dur_ms: list[float] = field(default_factory=list)
    step: list[int | None] = field(default_factory=list)
    args: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Aggregate:
    """Per-lane bins: busy share (0..1, None where a bin holds no event) and event counts."""

    bin_ms: float
    #: Centers of the bins, ms.
    centers_ms: list[float]
    busy: list[list[float | None]]
    count: list[list[int]]
    #: Per lane and bin: the index in EVENT_GROUPS of what the lane was busiest with (None
    #: where idle).
    group: list[list[int | None]] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class Parts:
    """What each rank's time was (the lost-time model, time_parts) in the window: one by one
    (`segments`: rank, start_ms, end_ms, part) when few, else per bin (`stack`: per rank,
    PART_SUBROWS x bins of indices into TIME_PARTS, bottom to top, None where the bin holds no
    step; `shares`: per rank, part -> share of each bin)."""

    ranks: tuple[int, ...] = ()
    mode: Literal["segments", "bins", "none"] = "none"
    segments: list[tuple[int, float, float, str]] = field(default_factory=list)
    bin_ms: float = 0.0
    centers_ms: list[float] = field(default_factory=list)
    stack: dict[int, list[list[int | None]]] = field(default_factory=dict)
    #: Per rank: each part's share of the whole window (for the lane label and tests).
    window_share: dict[int, dict[str, float]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Link:
    """One collective matched across ranks: its arrival point on each rank's lane."""

    label: str
    lanes: list[int]
    start_ms: list[float]
    ranks: list[int]


@dataclass(frozen=True, kw_only=True)
class TimelineData:
    lanes: tuple[Lane, ...]
    t0_ms: float
    t1_ms: float
    span_ms: float
    visible_events: int
    mode: Literal["raw", "aggregate", "empty"]
    raw: RawEvents | None = None
    aggregate: Aggregate | None = None
    links: tuple[Link, ...] = ()
    #: True when more collectives were in view than MAX_LINKS (none drawn then).
    links_cut: bool = False
    steps: tuple[tuple[int, float, float], ...] = ()
    offset_source: str = "none"
    parts: Parts = field(default_factory=Parts)
    #: The plot width asked for (TimelineRequest.width_px): what a bar's pixel width follows.
    width_px: int = 1200


def lanes(con: duckdb.DuckDBPyConnection, ctx: RunContext, req: TimelineRequest) -> list[Lane]:
    """The lanes of the run under the rank and category filters, ordered rank, host (main thread
    first), device. Lanes that hold no work (only wrappers such as the profiler's own
    'Spans/PyTorch Profiler' span) are left out."""
    rows = query(con, sql.LANES, {**ctx.params(), **_filters(req)})
    kept = [r for r in rows if r[10] > 0 or (r[5] > 0 and not r[4] and r[11] > 0)]
    main: dict[int, tuple[int, int, int]] = {}  # rank -> (step spans, events, row position)
    for i, r in enumerate(kept):
        if not r[1]:
            best = main.get(r[0])
            if best is None or (r[11], r[5]) > best[:2]:
                main[r[0]] = (r[11], r[5], i)
    mains = {v[2] for v in main.values()}
    order = sorted(
        range(len(kept)), key=lambda i: (kept[i][0], bool(kept[i][1]), i not in mains, i)
    )
    out: list[Lane] = []
    for i in order:
        rank, on_device, pid, tid, lbl, n, comm_n, pname, plabels, tname, _work, _steps = kept[i]
        if lbl:
            label = f"r{rank} {lbl}"
        else:
            if on_device:
                proc = plabels or f"device {pid}"
            else:
                proc = pname or f"pid {pid}"
            thread = (tname or "").strip() or (f"stream {tid}" if on_device else f"thread {tid}")
            label = f"r{rank} {proc} / {thread}"
        if i in mains:
            label = f"r{rank} main thread · {label.split(' ', 1)[1]}"
        out.append(
            Lane(
                index=len(out),
                rank=int(rank),
                on_device=bool(on_device),
                pid=None if pid == -1 else int(pid),
                tid=None if tid == -1 else int(tid),
                label=label,
                event_count=int(n),
                comm_count=int(comm_n),
                lane_label=lbl,
                main=i in mains,
            )
        )
    return out


def _filters(req: TimelineRequest) -> dict[str, object]:
    return {"ranks": list(req.ranks), "cats": list(req.categories)}


def step_spans(
    con: duckdb.DuckDBPyConnection, ctx: RunContext, ranks: tuple[int, ...] = ()
) -> list[tuple[int, float, float]]:
    """(step, start ms, end ms) of each profiler step over `ranks` (all when empty)."""
    rows = query(con, sql.STEPS, {"run": ctx.run_id, "ranks": list(ranks)})
    return [(int(s), ctx.to_ms(a), ctx.to_ms(b)) for s, a, b in rows]


def resolve_window(
    ctx: RunContext, req: TimelineRequest, spans: list[tuple[int, float, float]]
) -> tuple[float, float]:
    """The window to show, in ms: explicit t0/t1 win, then the chosen steps, then the run."""
    lo, hi = 0.0, max(ctx.span_ms, 1e-6)
    if req.steps:
        chosen = [(a, b) for s, a, b in spans if s in req.steps]
        if chosen:
            lo, hi = min(a for a, _ in chosen), max(b for _, b in chosen)
    t0 = lo if req.t0_ms is None else req.t0_ms
    t1 = hi if req.t1_ms is None else req.t1_ms
    t0, t1 = max(t0, 0.0 if req.t0_ms is None else -ctx.span_ms), min(t1, 2 * hi + 1)
    if t1 <= t0:
        t1 = t0 + 1e-3
    return t0, t1


def timeline(
    con: duckdb.DuckDBPyConnection,
    ctx: RunContext,
    req: TimelineRequest,
    lane_list: list[Lane] | None = None,
) -> TimelineData:
    """Everything the timeline draws for `req`, bounded whatever the trace size. `lane_list`:
    the result of `lanes(con, ctx, req)` when the caller cached it (it does not depend on the
    window, and costs a scan of the run)."""
    if lane_list is None:
        lane_list = lanes(con, ctx, req)
    spans = step_spans(con, ctx, req.ranks)
    t0, t1 = resolve_window(ctx, req, spans)
    a, b = ctx.to_ns(t0), max(ctx.to_ns(t1), ctx.to_ns(t0) + 1)
    offs: list[int] = [ctx.offsets_ns.get(r, 0) for r in ctx.ranks] or [0]
    params: dict[str, object] = {
        **ctx.params(),
        **_filters(req),
        "a": a,
        "b": b,
        "steps": list(req.steps),
        "prune_hi": b + max(offs),
        "prune_lo": a + min(offs) - LONG_EVENT_NS,
        "long_ns": LONG_EVENT_NS,
    }
    visible = int(query(con, sql.COUNT, params)[0][0])
    shown_steps = tuple(s for s in spans if s[2] > t0 and s[1] < t1)
    steps = shown_steps if len(shown_steps) <= MAX_STEP_MARKS else ()
    data = partial(
        TimelineData,
        lanes=tuple(lane_list),
        t0_ms=t0,
        t1_ms=t1,
        span_ms=ctx.span_ms,
        visible_events=visible,
        steps=steps,
        offset_source=ctx.offset_source,
        width_px=req.width_px,
    )
    if visible == 0 or not lane_list:
        return data(mode="empty", parts=time_parts(con, ctx, params, req.width_px, binned=False))
    index = {lane.key: lane.index for lane in lane_list}
    links: tuple[Link, ...] = ()
    cut = visible > LINKS_EVENT_LIMIT
    if not cut:
        links, cut = _links(con, ctx, params, index, lane_list)
    raw = agg = None
    if visible <= RAW_EVENT_LIMIT:
        raw = _raw(con, ctx, params, index)
    else:
        agg = _aggregate(con, ctx, params, lane_list, req.width_px)
    return data(
        mode="raw" if raw is not None else "aggregate",
        raw=raw,
        aggregate=agg,
        links=links,
        links_cut=cut,
        parts=time_parts(con, ctx, params, req.width_px, binned=raw is None),
    )


def _raw(
    con: duckdb.DuckDBPyConnection,
    ctx: RunContext,
    params: dict[str, object],
    index: dict[LaneKey, int],
) -> RawEvents:
    rows = query(con, sql.RAW, {**params, "args_chars": ARGS_CHARS, "limit": RAW_EVENT_LIMIT})
    out = RawEvents()
    open_ends: dict[int, list[int]] = defaultdict(list)  # lane -> end ns of the open stack
    for rank, on_dev, pid, tid, lbl, idx, name, cat, s, dur, step, args in rows:
        lane = index.get((rank, on_dev, pid, tid, lbl))
        if lane is None:
            continue
        stack = open_ends[lane]
        while stack and stack[-1] <= s:
            stack.pop()
        depth = len(stack)
        stack.append(s + dur)
        out.lane.append(lane)
        out.depth.append(depth)
        out.rank.append(int(rank))
        out.idx.append(int(idx))
        out.name.append(name)
        out.category.append(cat)
        out.start_ms.append(round(ctx.to_ms(s), 6))
        out.dur_ms.append(round(dur / 1e6, 6))
        out.step.append(step)
        out.args.append(args or "")
    return out


def _aggregate(
    con: duckdb.DuckDBPyConnection,
    ctx: RunContext,
    params: dict[str, object],
    lane_list: list[Lane],
    width_px: int,
) -> Aggregate:
    n_lanes = len(lane_list)
    nbins = _nbins(width_px, n_lanes)
    a, b = int(params["a"]), int(params["b"])  # type: ignore[call-overload]
    w = max(1, -(-(b - a) // nbins))
    nbins = -(-(b - a) // w)
    lanes_param = {
        "l_rank": [x.rank for x in lane_list],
        "l_dev": [x.on_device for x in lane_list],
        "l_pid": [x.key[2] for x in lane_list],
        "l_tid": [x.key[3] for x in lane_list],
        "l_lbl": [x.lane_label for x in lane_list],
        "l_idx": [x.index for x in lane_list],
    }
    cols = con.execute(
        scoped(con, sql.BINNABLE, params), bind(sql.BINNABLE, {**params, **lanes_param})
    ).fetchnumpy()
    lane = np.asarray(cols["lane"], dtype=np.int64)
    s = np.asarray(cols["s"], dtype=np.int64)
    order = np.argsort(lane * (b - a + 1) + (s - a), kind="stable")
    lane, s = lane[order], s[order]
    t = np.asarray(cols["t"], dtype=np.int64)[order]
    work = ~np.asarray(cols["wrapper"], dtype=bool)[order]
    grp = np.asarray(cols["grp"], dtype=np.int64)[order]
    busy_ns = _bins.union_busy(lane[work], s[work], t[work], n_lanes, a, w, nbins)
    counts = _bins.start_counts(lane, s, n_lanes, a, w, nbins)
    share = np.round(np.minimum(busy_ns / w, 1.0), 2)
    # What each lane was busiest with: summed time per (lane, group) and bin (no sort needed;
    # nested ops of one group count more than once, which only sharpens the ranking).
    ng = len(EVENT_GROUPS)
    key = lane[work] * ng + grp[work]
    by_group = _bins.sum_binned(key, s[work], t[work], n_lanes * ng, a, w, nbins)
    by_group = by_group.reshape(n_lanes, ng, nbins)
    dominant = np.argmax(by_group, axis=1)
    busy: list[list[float | None]] = [
        [None if n == 0 and v == 0 else float(v) for v, n in zip(srow, crow, strict=True)]
        for srow, crow in zip(share.tolist(), counts.tolist(), strict=True)
    ]
    group = [
        [None if v is None or v == 0 else int(g) for v, g in zip(brow, grow, strict=True)]
        for brow, grow in zip(busy, dominant.tolist(), strict=True)
    ]
    centers = [round(ctx.to_ms(a + i * w) + w / 2e6, 6) for i in range(nbins)]
    return Aggregate(
        bin_ms=w / 1e6, centers_ms=centers, busy=busy, count=counts.tolist(), group=group
    )


def _nbins(width_px: int, n_lanes: int) -> int:
    return max(20, min(MAX_BINS, width_px // 3, MAX_CELLS // max(n_lanes, 1)))


def time_parts(
    con: duckdb.DuckDBPyConnection,
    ctx: RunContext,
    params: dict[str, object],
    width_px: int,
    *,
    binned: bool,
) -> Parts:
    """What each rank's time was in the window (time_parts): its segments one by one when
    `binned` is False and there are at most MAX_PART_SEGMENTS, else stacked shares per bin."""
    p = {
        "run": ctx.run_id,
        "ranks": params["ranks"],
        "a": params["a"],
        "b": params["b"],
        "steps": params.get("steps", []),
    }
    ranks = tuple(int(r[0]) for r in query(con, sql.PARTS_RANKS, p))
    if not ranks:
        return Parts()
    a, b = int(params["a"]), int(params["b"])  # type: ignore[call-overload]
    n = int(query(con, sql.PARTS_COUNT, p)[0][0])
    if not binned and n <= MAX_PART_SEGMENTS:
        rows = query(con, sql.PARTS_ROWS, {**p, "limit": MAX_PART_SEGMENTS})
        segs = [
            (int(r), round(ctx.to_ms(x), 6), round(ctx.to_ms(y), 6), str(part))
            for r, x, y, part in rows
        ]
        share: dict[int, dict[str, float]] = {}
        for r, x, y, part in segs:
            d = share.setdefault(r, {})
            d[part] = d.get(part, 0.0) + (y - x) * 1e6 / max(b - a, 1)
        return Parts(ranks=ranks, mode="segments", segments=segs, window_share=share)
    nbins = _nbins(width_px, len(ranks) * 2)
    w = max(1, -(-(b - a) // nbins))
    nbins = -(-(b - a) // w)
    np_ = len(TIME_PARTS)
    cols = con.execute(
        scoped(con, sql.PARTS_BINNABLE, p),
        bind(sql.PARTS_BINNABLE, {**p, "r_ranks": list(ranks), "names": list(TIME_PARTS)}),
    ).fetchnumpy()
    key = np.asarray(cols["pos"], dtype=np.int64) * np_ + np.asarray(cols["pidx"], dtype=np.int64)
    s = np.asarray(cols["s"], dtype=np.int64)
    t = np.asarray(cols["t"], dtype=np.int64)
    # A rank's segments are disjoint: their sum per bin is their union, in any order.
    ns = _bins.sum_binned(key, s, t, len(ranks) * np_, a, w, nbins)
    ns = ns.reshape(len(ranks), np_, nbins)
    shares = ns / float(w)
    cum = np.cumsum(shares, axis=1)  # ranks x parts x bins
    levels = (np.arange(PART_SUBROWS) + 0.5) / PART_SUBROWS
    stack: dict[int, list[list[int | None]]] = {}
    window: dict[int, dict[str, float]] = {}
    for ri, r in enumerate(ranks):
        # Sub-row j of bin i shows the part whose cumulative share interval covers level j.
        idx = (cum[ri][:, None, :] < levels[None, :, None]).sum(axis=0)  # subrows x bins
        total = cum[ri][-1]
        grid = [
            [None if lv >= total[i] + 1e-9 else int(min(v, np_ - 1)) for i, v in enumerate(row)]
            for row, lv in zip(idx.tolist(), levels, strict=True)
        ]
        stack[r] = grid
        tot = ns[ri].sum(axis=1) / max(b - a, 1)
        window[r] = {name: float(tot[i]) for i, name in enumerate(TIME_PARTS) if tot[i] > 0}
    centers = [round(ctx.to_ms(a + i * w) + w / 2e6, 6) for i in range(nbins)]
    return Parts(
        ranks=ranks,
        mode="bins",
        bin_ms=w / 1e6,
        centers_ms=centers,
        stack=stack,
        window_share=window,
    )


def _links(
    con: duckdb.DuckDBPyConnection,
    ctx: RunContext,
    params: dict[str, object],
    index: dict[LaneKey, int],
    lane_list: list[Lane],
) -> tuple[tuple[Link, ...], bool]:
    """Collectives matched across ranks (the derived layer's matched_collectives), drawn through
    each rank's arrival. A point sits on the lane of the event it came from, else on the rank's
    busiest communication lane."""
    anchor: dict[int, tuple[int, int]] = {}
    for ln in lane_list:
        best = anchor.get(ln.rank)
        if best is None or ln.comm_count > best[1]:
            anchor[ln.rank] = (ln.index, ln.comm_count)
    limit = MAX_LINKS * max(len(ctx.ranks), 1) + 1
    rows = query(
        con,
        sql.LINKS,
        {
            "run": ctx.run_id,
            "a": params["a"],
            "b": params["b"],
            "ranks": params["ranks"],
            "limit": limit,
        },
    )
    if len(rows) >= limit:
        return (), True
    groups: dict[str, list[tuple[int, int, int]]] = defaultdict(list)
    ops: dict[str, str] = {}
    for key, op, rank, a_ns, *lane_key in rows:
        at = index.get((lane_key[0], lane_key[1], lane_key[2], lane_key[3], lane_key[4]))
        if at is None and rank in anchor:
            at = anchor[rank][0]
        if at is not None:
            groups[key].append((at, int(a_ns), int(rank)))
            ops[key] = op
    links = []
    for key, members in groups.items():
        if len({m[2] for m in members}) < 2:
            continue
        members.sort()
        links.append(
            Link(
                label=f"{ops[key]} {key}",
                lanes=[m[0] for m in members],
                start_ms=[round(ctx.to_ms(m[1]), 6) for m in members],
                ranks=[m[2] for m in members],
            )
        )
    if len(links) > MAX_LINKS:
        return (), True
    return tuple(links), False


def event_detail(
    con: duckdb.DuckDBPyConnection, ctx: RunContext, rank: int, idx: int
) -> dict[str, object] | None:
    """Everything about one event (for the detail panel), or None when it does not exist."""
    rows = query(
        con,
        f"""
        SELECT name, cat, category, ts_ns, dur_ns, pid, tid, stream, step, correlation,
               external_id, CAST(args AS VARCHAR)
        FROM {EVENTS} WHERE run_id = $run AND rank = $rank AND idx = $idx
        """,
        {"run": ctx.run_id, "ranks": [rank], "rank": rank, "idx": idx},
    )
    row = rows[0] if rows else None
    if row is None:
        return None
    keys = (
        "name",
        "cat",
        "category",
        "ts_ns",
        "dur_ns",
        "pid",
        "tid",
        "stream",
        "step",
        "correlation",
        "external_id",
        "args",
    )
    out = dict(zip(keys, row, strict=True))
    out["rank"] = rank
    out["start_ms"] = ctx.to_ms(int(row[3]) - int(ctx.offsets_ns.get(rank, 0)))
    out["dur_ms"] = int(row[4]) / 1e6
    args = str(out["args"] or "")
    out["args"] = args if len(args) <= 20_000 else args[:20_000] + " ... (cut at 20,000 characters)"
    return out
