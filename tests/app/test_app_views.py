"""The dashboard's core queries (tracelab.views) on stores with known contents."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracelab.figures.overview import step_heatmap, time_split_figure
from tracelab.figures.stragglers import arrival_heatmap, wait_figure
from tracelab.ingest import ingest
from tracelab.store import open_store, run_id
from tracelab.testing.synth import MS, RankTrace, build_run, write_ranks
from tracelab.views import overview as overview_view
from tracelab.views import stragglers as stragglers_view
from tracelab.views import timeline as tl
from tracelab.views.analysis import analyze_run
from tracelab.views.compare import HIST_BINS, comparison_rows, report, step_comparison
from tracelab.views.context import run_context
from tracelab.views.findings import step_windows, target, targets
from tracelab.views.overview import dim_split, rank_ranges, step_matrix, summary, time_split
from tracelab.views.ranksummary import rank_summary, standouts, typical_rank
from tracelab.views.runs import runs_page


@pytest.fixture(scope="module")
def nested_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One rank: host ops [0,10] ⊃ [2,4] and [6,9] ms, then [20,25]; kernels [0,5] and [30,40]."""
    folder = tmp_path_factory.mktemp("nested")
    t = RankTrace(0, 1)
    t.step(1, 0, 50 * MS)
    t.cpu_op("outer", 0, 10 * MS)
    t.cpu_op("inner_a", 2 * MS, 4 * MS)
    t.cpu_op("inner_b", 6 * MS, 9 * MS)
    t.cpu_op("later", 20 * MS, 25 * MS)
    t.kernel("k1", 0, 5 * MS)
    t.kernel("k2", 30 * MS, 40 * MS)
    db = folder / "n.duckdb"
    ingest(
        [str(p) for p in write_ranks(folder / "nested", [t])], db=str(db), run="nested", workers=1
    )
    return db


def _ctx(db: Path, name: str):  # type: ignore[no-untyped-def]
    with open_store(db) as con:
        return run_context(con, run_id(con, name))


def test_raw_mode_nests_host_ops_in_sub_rows(nested_db: Path) -> None:
    with open_store(nested_db) as con:
        ctx = run_context(con, run_id(con, "nested"))
        data = tl.timeline(con, ctx, tl.TimelineRequest())
    assert data.mode == "raw"
    raw = data.raw
    assert raw is not None
    depth = dict(zip(raw.name, raw.depth, strict=True))
    # The step annotation wraps everything on the host thread; kernels sit on their stream.
    assert depth["ProfilerStep#1"] == 0 and depth["outer"] == 1 and depth["later"] == 1
    assert depth["inner_a"] == 2 and depth["inner_b"] == 2 and depth["k1"] == 0
    start = dict(zip(raw.name, raw.start_ms, strict=True))
    assert start["inner_a"] == 2.0 and start["k2"] == 30.0  # exact: no float epoch rounding
    # 4 ops, 2 kernels, their 2 launches, the step annotation
    assert data.visible_events == len(raw.name) == 9
    lanes = {lane.label for lane in data.lanes}
    assert any("stream 7" in label for label in lanes)


def test_raw_events_tied_in_lane_start_and_duration_come_in_trace_order(tmp_path: Path) -> None:
    """Events alike in lane, start and duration came back in whatever order DuckDB's sort left
    them (1,400 such: 0, 443, 365, 268, ...), so their sub-rows and hover order could change
    between zooms. The trace's order (idx) breaks the tie."""
    t = RankTrace(0, 1)
    t.step(1, 0, 10 * MS)
    for i in range(1400):
        t.cpu_op(f"op{i}", 100_000 + 1000 * (i // 500), 100_000 + 1000 * (i // 500) + 5000)
    db = tmp_path / "t.duckdb"
    ingest([str(p) for p in write_ranks(tmp_path / "ties", [t])], db=str(db), run="t", workers=1)
    with open_store(db) as con:
        data = tl.timeline(con, run_context(con, run_id(con, "t")), tl.TimelineRequest())
    raw = data.raw
    assert data.mode == "raw" and raw is not None and len(raw.idx) == 1401
    ops = [
        (s, i)
        for s, i, n in zip(raw.start_ms, raw.idx, raw.name, strict=True)
        if n != "ProfilerStep#1"
    ]
    assert ops == sorted(ops)


def test_bars_carry_as_much_of_their_name_as_fits(nested_db: Path) -> None:
    """Zoomed in, every bar is named up to its width: whole where it fits, cut with "…" where
    part fits, and unnamed only when not even four characters fit (plotly measures each label
    it is given, the cost that held single-event zooms above a second)."""
    from tracelab.figures.timeline import (
        CHAR_PX,
        LABEL_PAD_PX,
        MARGIN_L_PX,
        MARGIN_R_PX,
        timeline_figure,
    )

    with open_store(nested_db) as con:
        ctx = run_context(con, run_id(con, "nested"))
        data = tl.timeline(con, ctx, tl.TimelineRequest(t0_ms=0, t1_ms=50, width_px=1200))
    fig = timeline_figure(data)
    px_per_ms = (1200 - MARGIN_L_PX - MARGIN_R_PX) / 50
    labels: dict[str, str] = {}
    for trace in fig["data"]:
        if trace.get("type") != "bar" or trace["name"].startswith("time:"):
            continue
        for text, width_ms, hover in zip(
            trace["text"], trace["x"], trace["hovertext"], strict=True
        ):
            name = hover.split("</b>")[0].removeprefix("<b>")
            labels[name] = text
            fits = int((width_ms * px_per_ms - LABEL_PAD_PX) / CHAR_PX)
            assert len(text) <= max(fits, 0), (name, text, fits)
    # 18.6 px per ms: "outer" (10 ms) and "later" (5 ms) fit whole, "ProfilerStep#1" (50 ms)
    # too; "inner_a" (2 ms, 37 px) gets 5 characters, the launches (µs) none.
    assert labels["outer"] == "outer" and labels["later"] == "later"
    assert labels["ProfilerStep#1"] == "ProfilerStep#1"
    assert labels["inner_a"] == "inne…"
    assert all(text == "" for name, text in labels.items() if "Launch" in name), labels


def test_aggregate_busy_share_is_the_union_of_intervals(
    nested_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced into aggregate mode with 10 ms bins over [0, 50] ms: the host lane is busy 10 ms in
    bin 0 (nested ops count once), 5 ms in bin 2; the stream is busy 5, 0, 0, 10 ms."""
    monkeypatch.setattr(tl, "RAW_EVENT_LIMIT", 2)
    with open_store(nested_db) as con:
        ctx = run_context(con, run_id(con, "nested"))
        origin = ctx.origin_ns
        data = tl.timeline(con, ctx, tl.TimelineRequest(t0_ms=0.0, t1_ms=50.0, width_px=40))
    assert data.mode == "aggregate" and data.aggregate is not None
    assert origin == ctx.origin_ns
    agg = data.aggregate
    nbins = len(agg.centers_ms)
    assert nbins == 20 and agg.bin_ms == pytest.approx(2.5)
    host = next(l.index for l in data.lanes if not l.on_device and "thread 1" in l.label)
    dev = next(l.index for l in data.lanes if l.on_device)
    busy_host_ms = [(b or 0) * agg.bin_ms for b in agg.busy[host]]
    assert sum(busy_host_ms[0:4]) == pytest.approx(10.0)  # [0,10]: the union, not 15
    assert sum(busy_host_ms[8:10]) == pytest.approx(5.0)  # [20,25]
    assert sum(busy_host_ms) == pytest.approx(15.0)  # the step annotation does not count
    busy_dev_ms = [(b or 0) * agg.bin_ms for b in agg.busy[dev]]
    assert sum(busy_dev_ms) == pytest.approx(15.0)
    assert sum(busy_dev_ms[12:16]) == pytest.approx(10.0)
    assert sum(sum(row) for row in agg.count) == data.visible_events


def test_lod_on_a_real_trace_is_bounded_and_counts_every_event(
    tmp_path: Path, hta_traces: Path
) -> None:
    db = tmp_path / "real.duckdb"
    ingest([str(hta_traces / "df_index_resolver")], db=str(db), run="real")
    with open_store(db) as con:
        ctx = run_context(con, run_id(con, "real"))
        whole = tl.timeline(con, ctx, tl.TimelineRequest(width_px=1200))
        assert whole.mode == "aggregate" and whole.aggregate is not None
        cells = sum(len(row) for row in whole.aggregate.busy)
        assert cells <= tl.MAX_CELLS
        assert len(whole.aggregate.centers_ms) <= tl.MAX_BINS
        # Every event of a drawn lane is counted once; lanes holding no work (the profiler's
        # own 'Spans/PyTorch Profiler' span) are not drawn.
        drawn = sum(lane.event_count for lane in whole.lanes)
        assert sum(sum(r) for r in whole.aggregate.count) == drawn
        assert whole.visible_events == ctx.event_count and ctx.event_count - drawn <= 1
        assert all(0 <= b <= 1 for row in whole.aggregate.busy for b in row if b is not None)
        # Zoom until few events are visible: raw events, all of them, within the window.
        mid = ctx.span_ms / 2
        narrow = tl.timeline(con, ctx, tl.TimelineRequest(t0_ms=mid, t1_ms=mid + 0.5))
        assert narrow.mode == "raw" and narrow.raw is not None
        assert 0 < len(narrow.raw.name) <= narrow.visible_events <= tl.RAW_EVENT_LIMIT
        assert narrow.visible_events - len(narrow.raw.name) <= 1  # the profiler's own span
        for s, d in zip(narrow.raw.start_ms, narrow.raw.dur_ms, strict=True):
            assert s < mid + 0.5 and s + d > mid
        # Category filter: only kernels' category.
        comp = tl.timeline(
            con, ctx, tl.TimelineRequest(t0_ms=mid, t1_ms=mid + 0.5, categories=("compute",))
        )
        assert comp.raw is not None and set(comp.raw.category) <= {"compute"}


def test_collective_links_follow_arrivals(app_store: Path) -> None:
    """The stragglers scenario: rank 2 arrives 5 ms after rank 0 at each of 4 all-reduces."""
    with open_store(app_store) as con:
        ctx = run_context(con, run_id(con, "stragglers"))
        data = tl.timeline(con, ctx, tl.TimelineRequest())
    assert data.mode == "raw" and not data.links_cut
    assert len(data.links) == 4
    for link in data.links:
        assert sorted(link.ranks) == [0, 1, 2, 3]
        arrive = dict(zip(link.ranks, link.start_ms, strict=True))
        assert arrive[2] - arrive[0] == pytest.approx(5.0, abs=1e-6)
        assert max(arrive, key=arrive.get) == 2  # type: ignore[arg-type]


def test_step_filter_sets_the_window(app_store: Path) -> None:
    with open_store(app_store) as con:
        ctx = run_context(con, run_id(con, "stragglers"))
        spans = tl.step_spans(con, ctx)
        data = tl.timeline(con, ctx, tl.TimelineRequest(steps=(2,)))
    s2 = next(s for s in spans if s[0] == 2)
    assert (data.t0_ms, data.t1_ms) == pytest.approx((s2[1], s2[2]))
    assert [s[0] for s in data.steps] == [2]


def test_event_detail_returns_full_args(app_store: Path) -> None:
    with open_store(app_store) as con:
        ctx = run_context(con, run_id(con, "stragglers"))
        data = tl.timeline(con, ctx, tl.TimelineRequest())
        raw = data.raw
        assert raw is not None
        i = raw.category.index("communication")
        ev = tl.event_detail(con, ctx, raw.rank[i], raw.idx[i])
        assert ev is not None and ev["name"] == raw.name[i]
        assert "Collective name" in str(ev["args"])
        assert tl.event_detail(con, ctx, 0, 10**9) is None


def test_step_matrix_time_split_and_findings(app_store: Path) -> None:
    with open_store(app_store) as con:
        rid = run_id(con, "stragglers")
        ctx = run_context(con, rid)
        found = analyze_run(con, rid)
        m = step_matrix(con, rid, found.metric("steps", "step_ns"))
        spans = {
            (r, s): d
            for r, s, d in con.execute(
                "SELECT rank, step, dur_ns FROM step_spans WHERE run_id = ?", [rid]
            ).fetchall()
        }
        windows, typical = step_windows(con, rid)
    assert m.ranks == [0, 1, 2, 3] and m.steps == [1, 2, 3, 4]
    # The heatmap's cells are the derived layer's steps; its reference is the run's step time.
    for i, r in enumerate(m.ranks):
        for j, s in enumerate(m.steps):
            assert m.ns[i][j] == spans[(r, s)]
    assert m.reference_ns == found.budget.step_ns
    split = time_split(found)
    assert split is not None and split.ranks == [0, 1, 2, 3]
    assert split.step_ns == found.budget.step_ns == found.metric("steps", "step_ns")
    assert sum(p.job_ns for p in split.parts) == pytest.approx(split.step_ns, rel=1e-9)
    for i in range(4):  # each rank's parts add up to its own steady step
        assert sum(p.rank_ns[i] for p in split.parts) == pytest.approx(split.rank_step_ns[i])
    # Root cause first: the parts claimed by the first finding lead.
    first = next(f for f in found.findings if f.claim and f.impact_ns_per_step)
    assert split.parts[0].finding is first
    claimed = [p.finding is not None for p in split.parts]
    assert claimed == sorted(claimed, reverse=True)  # claimed parts before the others
    ts = targets(found.findings, ctx, windows, typical)
    assert [t.finding for t in ts] == list(found.findings)  # the runner's order
    straggler = next(t for t in ts if t.finding.code.startswith("STRAGGLER"))
    assert straggler.view == "stragglers" and straggler.ranks[0] == 2
    assert set(straggler.ranks) == {2, *straggler.finding.evidence.affected_ranks}
    assert straggler.t0_ms is not None and straggler.t1_ms is not None
    for a, b_ in straggler.finding.evidence.time_ranges_ns:
        assert straggler.t0_ms <= ctx.to_ms(a) <= ctx.to_ms(b_) <= straggler.t1_ms
    # Findings without time ranges still open at a step of the run.
    assert all(t.t0_ms is not None for t in ts)
    assert not found.errors


def test_runs_page_and_compare(app_store: Path) -> None:
    with open_store(app_store) as con:
        p = runs_page(con, 1, page_rows=2)
        assert p.total >= 4 and len(p.rows) == 2 and p.page == 1
        assert runs_page(con, 999, page_rows=2).page == -(-p.total // 2)  # clamped
        a, b = run_id(con, "stragglers"), run_id(con, "pipeline")
        c = step_comparison(con, a, b)
        steady = con.execute(
            "SELECT count(*), median(dur_ns) / 1e6 FROM step_spans WHERE run_id = ? AND steady", [a]
        ).fetchone()
        assert c.a.count == steady[0] and c.a.median == pytest.approx(steady[1])
        assert sum(c.a.hist) == c.a.count and sum(c.b.hist) == c.b.count
        assert len(c.edges) == HIST_BINS
        rep = report(con, a, b)
        rows = comparison_rows(rep)
    # The report's rows, each once, most significant first, with human labels.
    assert sorted(r["key"] for r in rows) == sorted(r.key for r in rep.rows)
    order = {"regression": 0, "improved": 1, "warn": 2, "pass": 3, "info": 4}
    ranks = [order[r["verdict_key"]] for r in rows]
    assert ranks == sorted(ranks)
    step = next(r for r in rows if r["key"] == "step_time")
    assert step["metric"] == "Step time (median step)" and step["a"].endswith("ms")
    assert all(
        r["metric"] != r["key"] and not r["metric"].startswith(r["key"].split("[")[0]) for r in rows
    )


def test_a_run_against_itself_is_extracted_once(
    app_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compare (and `tracelab report`) of a run against itself extracted its metrics twice: at
    10,000 ranks `tracelab report` took 4.65-5.11 s, 3.35-3.60 s once. The same report."""
    import tracelab.report.metrics as metrics

    seen: list[int] = []
    real = metrics.extract

    def counted(con: object, run: int, *a: object) -> object:
        seen.append(run)
        return real(con, run, *a)  # type: ignore[arg-type]

    with open_store(app_store) as con:
        a = run_id(con, "stragglers")
        twice = comparison_rows(report(con, a, a))
        monkeypatch.setattr(metrics, "extract", counted)
        once = comparison_rows(report(con, a, a))
        b = run_id(con, "pipeline")
        report(con, a, b)
    assert seen == [a, a, b]  # once for the run against itself, then each of two runs
    assert once == twice


def test_one_value_per_metric_on_every_view(app_store: Path, sample_runs: list[str]) -> None:
    """Issue 12: the step time, the overlap and the findings' order the views show are the
    runner's (steps.step_ns = the budget's step; breakdown.overlap_share_mean), on every
    sample capture: Overview headline, Runs page, heatmap reference, where-the-time-goes."""
    from tracelab.render.text import duration

    names = ["stragglers", "pipeline", *sample_runs]
    with open_store(app_store) as con:
        rows = {r["name"]: r for r in runs_page(con, 1, page_rows=500).rows}
        for name in names:
            rid = run_id(con, name)
            ctx = run_context(con, rid)
            found = analyze_run(con, rid)
            step_ns = found.metric("steps", "step_ns")
            assert step_ns == pytest.approx(found.budget.step_ns)
            assert rows[name]["step_ns"] == pytest.approx(step_ns), name
            items = dict(summary(ctx, found).items)
            assert items["step time"] == duration(step_ns)
            ov = found.metric("breakdown", "overlap_share_mean")
            assert items["comm/compute overlap"] == f"{100 * ov:.1f}%"
            split = time_split(found)
            assert split is not None and split.step_ns == pytest.approx(step_ns)
            assert step_matrix(con, rid, step_ns).reference_ns == step_ns
            loss = max(
                (p for p in split.parts if p.part != "compute"),
                key=lambda p: p.job_ns,
                default=None,
            )
            if loss is not None:
                assert rows[name]["loss_share"] == pytest.approx(loss.job_ns / step_ns, rel=1e-6)


def test_rank_summary_picks_the_slow_rank(tmp_path: Path) -> None:
    """40 ranks, rank 33 computes 8 ms longer before each all-reduce: it is the outlier."""
    arrivals = tuple(8.0 if r == 33 else 0.5 * (r % 3) for r in range(40))
    run = build_run(tmp_path, "stragglers", arrivals_ms=arrivals, end_ms=10, steps=3, name="many")
    db = tmp_path / "many.duckdb"
    ingest([str(p) for p in run.paths], db=str(db), run="many", workers=1)
    with open_store(db) as con:
        s = rank_summary(con, run_id(con, "many"))
    assert len(s.ranks) == 40
    assert [o.rank for o in s.outliers] == [33]
    assert s.typical_rank is not None and s.typical_rank != 33


def test_many_ranks_draw_a_typical_rank_and_those_that_stand_out(
    app_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """40 ranks, rank 33 slow: "where the time goes" drew the first 64 ranks (at 512 ranks a
    straggler at rank 300 was not among them, and the title did not say so), the heatmap the
    first 256. Now: the job, a typical rank and the ranks that stand out, each with why; the
    heatmap keeps those and the ranks of the slowest steps."""
    with open_store(app_store) as con:
        rid = run_id(con, "many")
        found = analyze_run(con, rid)
        split = time_split(found)
        assert split is not None and split.total_ranks == 40
        straggler = next(f for f in found.findings if f.code.startswith("STRAGGLER"))
        assert straggler.evidence.ranks == (33,)
        assert split.reasons[0] == "typical" and split.ranks[0] != 33
        assert split.ranks[1:] == [33] and split.reasons[1:] == [straggler.code]
        rows = {int(x["rank"]): x for x in found.table("breakdown", "ranks")}
        for i, r in enumerate(split.ranks):  # each drawn rank's own parts, adding up to its step
            steps = max(int(rows[r]["steps"]), 1)
            assert split.rank_step_ns[i] == pytest.approx(rows[r]["window_ns"] / steps)
            assert sum(p.rank_ns[i] for p in split.parts) == pytest.approx(split.rank_step_ns[i])
        fig = time_split_figure(split)
        assert fig["data"][0]["y"][2] == f"rank 33 · {straggler.code}"
        assert "of 40 ranks, a typical one and those that stand out" in str(fig["layout"])
        assert time_split(found, max_ranks=40).reasons == []  # all fit: all drawn, no why

        monkeypatch.setattr(overview_view, "MAX_HEAT_RANKS", 39)
        monkeypatch.setattr(overview_view, "PICKED_RANKS", 4)
        alone = step_matrix(con, rid)  # no chart above (no budget): its title names none
        m = step_matrix(con, rid, first=[7])
        worst = dict(
            con.execute(
                "SELECT rank, max(dur_ns) FILTER (WHERE steady) FROM step_spans "
                "WHERE run_id = ? GROUP BY rank",
                [rid],
            ).fetchall()
        )
    slowest = sorted((r for r in worst if r != 7), key=lambda r: (-worst[r], r))[:3]
    assert m.picked and m.total_ranks == 40
    assert m.ranks == sorted([7, *slowest])
    assert "the 4 of 40 ranks with the slowest steps and those drawn above" in str(
        step_heatmap(m)["layout"]
    )
    assert alone.picked and "drawn above" not in str(step_heatmap(alone)["layout"])


def test_arrival_heatmap_of_many_ranks_draws_the_late_ones(
    app_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Stragglers page's arrival heatmap drew the first 256 ranks: a late rank past them
    was not in it. Of more ranks than it draws, it draws the blamed and then the latest."""
    monkeypatch.setattr(stragglers_view, "MAX_HEAT_RANKS", 39)
    monkeypatch.setattr(stragglers_view, "PICKED_RANKS", 4)
    with open_store(app_store) as con:
        rid = run_id(con, "many")
        found = analyze_run(con, rid)
        v = stragglers_view.straggler_view(con, found, run_context(con, rid))
        result = found.get("stragglers")
        assert result is not None
        colls = sorted(
            result.tables["collectives"],
            key=lambda c: (c.get("last_arrival_ns") or 0, str(c.get("key"))),
        )[: stragglers_view.COLLECTIVES_PER_PAGE]
        rows = con.execute(
            stragglers_view.ARRIVALS_SQL, [rid, [str(c["key"]) for c in colls]]
        ).fetchall()
    by_key: dict[str, dict[int, int]] = {}
    for key, rank, start in rows:
        by_key.setdefault(str(key), {})[int(rank)] = int(start)
    late: dict[int, int] = {}
    for arr in by_key.values():
        for r, t in arr.items():
            late[r] = max(late.get(r, 0), t - min(arr.values()))
    assert v.blamed == [33] and v.heat_total_ranks == len(late) == 40
    others = sorted((r for r in late if r != 33), key=lambda r: (-late[r], r))[:3]
    assert v.heat_ranks == sorted([33, *others])
    row = v.heat_ranks.index(33)
    assert max(x for x in v.heat_ns[row] if x is not None) == late[33]
    assert "the 4 of 40 ranks that arrive latest" in str(arrival_heatmap(v)["layout"])
    # The per-rank table: the blamed rank first (it was on the page of its number), then in order.
    assert [x["rank"] for x in v.ranks] == [33, *[r for r in range(40) if r != 33]]
    assert v.ranks[0]["blamed"] == "yes" and v.ranks[1]["blamed"] == ""
    # The wait chart of 40 ranks (over WAIT_RANKS) draws a typical rank and the blamed one: its
    # bar of the wait it caused was one sliver among 512 at 512 ranks.
    assert v.wait_why == ["typical", "blamed"] and v.wait_ranks[1]["rank"] == 33
    waits = sorted(float(x["wait_ns_per_step"] or 0) for x in v.ranks)
    assert float(v.wait_ranks[0]["wait_ns_per_step"]) == waits[len(waits) // 2]
    fig = wait_figure(v)
    assert fig["data"][0]["x"] == [f"rank {v.wait_ranks[0]['rank']} · typical", "rank 33 · blamed"]
    assert "of 40 ranks, a typical one and those that stand out" in str(fig["layout"])


def test_standouts_singled_out_ranks_first_then_each_metric_s_outliers() -> None:
    step = {r: 10.0 for r in range(20)} | {7: 14.0, 8: 10.1}
    host = {r: 0.0 for r in range(20)} | {3: 2.0}
    got = standouts({"step": step, "host": host}, [("STRAGGLER_HOST", [12, 7])])
    assert got[:2] == [(12, "STRAGGLER_HOST"), (7, "STRAGGLER_HOST")]
    assert sorted(got[2:]) == [(3, "host, median 0"), (8, "+1% step")]
    assert standouts({"step": step}, limit=1) == [(7, "+40% step")]
    assert standouts({"step": {r: 5.0 for r in range(9)}}) == []  # nobody stands out
    # The farthest first, in ns, across metrics, and only by a material distance: ranked by z,
    # 200 ns of memcpy on 20 ranks (a part 0 on the others) and noise took every slot from a
    # rank 20% slower (found by a review).
    assert standouts({"step": step, "host": host}, material=0.5) == [
        (7, "+40% step"),
        (3, "host, median 0"),
    ]
    many_step = {r: 4e6 + (r % 7) * 1e3 for r in range(512)} | {400: 4.8e6}
    memcpy = {r: 200.0 if 100 <= r < 120 else 0.0 for r in range(512)}
    got = standouts({"step": many_step, "memcpy": memcpy}, limit=4, material=0.02 * 4e6)
    assert got == [(400, "+20% step")]
    assert typical_rank({4: 1.0, 2: 3.0, 9: 3.0, 1: 9.0}) == 2  # the lowest of the closest
    assert typical_rank({}) is None


def test_finding_without_time_ranges_has_no_window(app_store: Path) -> None:
    from tracelab.results import Evidence, Finding, Severity

    f = Finding(
        code="X",
        severity=Severity.INFO,
        title="t",
        evidence=Evidence(ranks=(1, 99)),
        impact_ns_per_step=None,
        impact_share=None,
        suggestion="s",
        view="nowhere",
    )
    ctx = _ctx(app_store, "stragglers")
    t = target(f, ctx)
    assert t.view == "overview" and t.t0_ms is None and t.ranks == (1,)


def test_union_binning_matches_brute_force() -> None:
    """Random nested and overlapping intervals on 3 lanes: busy per bin equals a per-ns sweep."""
    import numpy as np

    from tracelab.views._bins import start_counts, union_busy

    rng = np.random.default_rng(7)
    a, w, nbins, n_lanes = 1_000, 7, 30, 3
    lanes, starts, ends = [], [], []
    for lane in range(n_lanes):
        for _ in range(40):
            s = int(rng.integers(a, a + w * nbins))
            e = min(s + int(rng.integers(1, 60)), a + w * nbins)
            lanes.append(lane), starts.append(s), ends.append(e)
    order = np.lexsort((np.array(starts), np.array(lanes)))
    lane = np.array(lanes, dtype=np.int64)[order]
    s = np.array(starts, dtype=np.int64)[order]
    t = np.array(ends, dtype=np.int64)[order]
    got = union_busy(lane, s, t, n_lanes, a, w, nbins)
    covered = np.zeros((n_lanes, w * nbins), dtype=bool)
    for ln, x, y in zip(lane, s, t, strict=True):
        covered[ln, x - a : y - a] = True
    want = covered.reshape(n_lanes, nbins, w).sum(axis=2)
    assert np.array_equal(got, want)
    counts = start_counts(lane, s, n_lanes, a, w, nbins)
    assert counts.sum() == len(lanes) and counts[0].sum() == 40


def test_pipeline_per_rank_chart_is_the_step_split_into_its_parts(app_store: Path) -> None:
    """The Pipeline view's per-rank chart stacks the step's lost-time parts (the Overview's), so
    every rank's bar is its whole step: rank 0 of a 1F1B run pays its exposed send/recv too,
    which a compute/bubble/stall split of the pipeline window left out (its bar stopped at
    68% on the sample capture)."""
    from tracelab.figures.pipeline import bubble_figure
    from tracelab.views.pipeline import pipeline_view

    with open_store(app_store) as con:
        rid = run_id(con, "pipeline")
        v = pipeline_view(con, analyze_run(con, rid), run_context(con, rid))
        parts = {
            int(r[0]): r[1:]
            for r in con.execute(
                """SELECT rank, avg(step_ns), avg(bubble_ns), avg(stall_ns) FROM step_parts
                   WHERE run_id = ? AND steady GROUP BY rank""",
                [rid],
            ).fetchall()
        }
    fig = bubble_figure(v)
    bars = [t for t in fig["data"] if t["type"] == "bar"]
    totals: dict[str, float] = {}
    by_name = {t["name"]: dict(zip(t["x"], t["y"], strict=True)) for t in bars}
    for t in bars:
        for x, y in zip(t["x"], t["y"], strict=True):
            totals[x] = totals.get(x, 0.0) + y
    assert totals and all(abs(t - 1.0) < 1e-9 for t in totals.values()), totals
    for rank, (step, bubble, stall) in parts.items():
        assert by_name["bubble (the schedule needs it)"][f"rank {rank}"] == pytest.approx(
            bubble / step
        )
        stalls = by_name.get("stall (waiting beyond the schedule)", {})
        assert stalls.get(f"rank {rank}", 0.0) == pytest.approx(stall / step)


def test_rank_ranges_are_compact() -> None:
    assert rank_ranges([3, 0, 1, 2]) == "0-3"
    assert rank_ranges([0, 1]) == "0, 1"
    assert rank_ranges([0, 2]) == "0, 2"
    assert rank_ranges([0, 1, 2, 3, 8, 9, 10, 11, 13]) == "0-3, 8-11, 13"
    assert rank_ranges(list(range(0, 64, 8))) == "0, 8, ..., 56"
    assert rank_ranges([5]) == "5"


PROBE = "<img src=x onerror=alert(1)>"


def test_dim_split_names_each_group_with_its_ranks(tmp_path: Path) -> None:
    """4 ranks: all-reduces on the default group '0' (ranks 0-3) and on two tensor-parallel
    groups (DeviceMesh names them mesh_tp), one of them named by the XSS probe: the Overview's
    dimension rows name every group with its ranks, and a trace's name stays plain text."""
    traces = []
    for rank in range(4):
        t = RankTrace(rank, 4)
        tp = [0, 1] if rank < 2 else [2, 3]
        tp_name = "1" if rank < 2 else PROBE
        for k in range(4):
            o = k * 20 * MS
            t.step(k + 1, o, o + 18 * MS)
            t.kernel("gemm", o + 1 * MS, o + 4 * MS)
            t.nccl("all_reduce", o + 4 * MS, o + 7 * MS, nbytes=1 << 20, group_ranks=tp,
                   pg_name=tp_name, pg_desc="mesh_tp")  # fmt: skip
            t.nccl("all_reduce", o + 8 * MS + rank * MS, o + 14 * MS, nbytes=1 << 20)
        traces.append(t)
    db = tmp_path / "d.duckdb"
    ingest([str(p) for p in write_ranks(tmp_path / "dims", traces)], db=str(db), run="dims",
           workers=1)  # fmt: skip
    with open_store(db) as con:
        rid = run_id(con, "dims")
        rows = {r.dim: r for r in dim_split(con, rid, analyze_run(con, rid))}
    assert rows["dp"].groups == ["0"]
    assert rows["dp"].group_labels == ["group 0 (default_pg; ranks 0-3)"]
    labels = dict(zip(rows["tp"].groups, rows["tp"].group_labels, strict=True))
    assert labels == {
        "1": "group 1 (mesh_tp; ranks 0, 1)",
        PROBE: f"group {PROBE} (mesh_tp; ranks 2, 3)",
    }


def test_memory_notes_are_said_once(app_store: Path) -> None:
    """A run without a pipeline (sample fsdp2) printed "no memory estimate: ..." twice on the
    Memory page (with the other notes, and where the estimate would be drawn); a run with no
    memory data (overlap_gloo) had only "device capacity unknown" for a headline, and "no
    findings" under it."""
    from tracelab.views.memory import memory_view

    with open_store(app_store) as con:
        fsdp = memory_view(analyze_run(con, run_id(con, "sample-fsdp2")))
        bare = memory_view(analyze_run(con, run_id(con, "overlap_gloo")))
    assert (
        fsdp.estimate_note.startswith("no memory estimate") and "no pipeline" in fsdp.estimate_note
    )
    assert "no memory estimate" not in fsdp.note
    assert not bare.available and bare.headline() == "No memory measured in this run."
