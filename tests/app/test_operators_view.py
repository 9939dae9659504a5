"""The Operators view: self and total (inclusive) time, as the TensorBoard plugin's Operator view
defines them, grouping by input shape; the view called directly and the page's layout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tracelab.ingest import ingest
from tracelab.store import open_store, resolve_run
from tracelab.views.operators import TREE_CATEGORIES, operators_view

US = 1000  # ns per µs
FIXTURES = Path(__file__).resolve().parents[1] / "golden" / "fixtures" / "tb_plugin"


def _ingest(tmp: Path, name: str, events: list[dict[str, Any]]) -> Path:
    doc = {
        "schemaVersion": 1,
        "traceEvents": events,
        "distributedInfo": {"rank": 0, "world_size": 1},
    }
    (tmp / name).mkdir()
    path = tmp / name / "worker0.pt.trace.json"
    path.write_text(json.dumps(doc))
    db = tmp / f"{name}.duckdb"
    ingest([path], db=db, run=name, workers=1, progress=False)
    return db


def _op(name: str, ts: int, dur: int, cat: str = "cpu_op", tid: int = 1, **args: Any) -> dict:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 1,
        "tid": tid,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def _view(db: Path, name: str, **kw: Any) -> dict[Any, dict[str, Any]]:
    with open_store(db, read_only=True) as con:
        rid, _ = resolve_run(con, name)
        v = operators_view(con, rid, **kw)
    return {(r["name"], r["shape"]) if kw.get("by_shape") else r["name"]: r for r in v.operators}


def test_self_time_tb_plugin_all_categories(tmp_path: Path) -> None:
    """The plugin's test_all_categories trace: aten::nll_loss_backward runs 70 µs and calls
    cudaMemcpyAsync (20), cudaMemsetAsync (10) and cudaLaunchKernel (5): self 35 µs, as the
    plugin's self host duration (duration minus its children in the operator tree). aten::to
    (60 µs, inside the DataLoader annotation, no children) is all self."""
    events = json.loads((FIXTURES / "all_categories.rank0.json").read_text())
    db = _ingest(tmp_path, "all_categories", events)
    ops = _view(db, "all_categories")
    assert ops["aten::nll_loss_backward"]["total_ns"] == 70 * US
    assert ops["aten::nll_loss_backward"]["self_ns"] == 35 * US
    assert ops["aten::to"]["total_ns"] == ops["aten::to"]["self_ns"] == 60 * US
    # Ranked by self time: aten::to first though its total is smaller.
    assert list(ops) == ["aten::to", "aten::nll_loss_backward"]
    shaped = _view(db, "all_categories", by_shape=True)
    assert set(shaped) == {
        ("aten::to", "[[2,8,5],[],[],[],[],[],[],[]]"),
        ("aten::nll_loss_backward", "[[],[32,1000],[32],[],[],[],[]]"),
    }


def test_backward_and_its_wrapper_are_not_additive(tmp_path: Path) -> None:
    """autograd's wrapper (500 µs) around MmBackward0 (480) around two aten::mm (280 and 180,
    back to back: the first ends as the second starts) with a launch each (20, 10), and a
    zero-length op: totals nest, self times tile the wrapper's 500 µs."""
    wrapper = "autograd::engine::evaluate_function: MmBackward0"
    events = [
        _op("ProfilerStep#1", 0, 1000, cat="user_annotation"),
        _op(wrapper, 100, 500),
        _op("MmBackward0", 110, 480),
        _op("aten::mm", 120, 280, **{"Input Dims": [[4, 8], [8, 16]]}),
        _op("cudaLaunchKernel", 130, 20, cat="cuda_runtime"),
        _op("aten::mm", 400, 180, **{"Input Dims": [[8, 8], [8, 8]]}),
        _op("cudaLaunchKernel", 410, 10, cat="cuda_runtime"),
        _op("aten::empty", 590, 0),
        _op("aten::add", 700, 50, tid=2),  # another thread: nothing to do with the wrapper
    ]
    db = _ingest(tmp_path, "nested", events)
    ops = _view(db, "nested")
    assert ops[wrapper]["total_ns"] == 500 * US and ops[wrapper]["self_ns"] == 20 * US
    assert ops["MmBackward0"]["total_ns"] == 480 * US
    assert ops["MmBackward0"]["self_ns"] == (480 - 280 - 180) * US
    assert ops["aten::mm"]["n"] == 2 and ops["aten::mm"]["total_ns"] == 460 * US
    assert ops["aten::mm"]["self_ns"] == (460 - 30) * US
    assert ops["aten::empty"]["self_ns"] == ops["aten::empty"]["total_ns"] == 0
    assert ops["aten::add"]["self_ns"] == 50 * US
    # The self times of the wrapper's tree add up to its duration (the runtime calls' 30 µs are
    # theirs); the totals do not.
    tree = (wrapper, "MmBackward0", "aten::mm", "aten::empty")
    assert sum(ops[n]["self_ns"] for n in tree) + 30 * US == 500 * US
    assert sum(ops[n]["total_ns"] for n in tree) > 500 * US
    assert ops["aten::mm"]["self_share"] == pytest.approx(430 / 1000)
    shaped = _view(db, "nested", by_shape=True)
    assert shaped[("aten::mm", "[[4,8],[8,16]]")]["self_ns"] == 260 * US
    assert shaped[("aten::mm", "[[8,8],[8,8]]")]["self_ns"] == 170 * US


def _stack_self(con: Any, rid: int) -> dict[str, list[int]]:
    """Operator name -> [total, self] ns in the steady steps, by a stack walk over each thread's
    tree events in start order (an independent reading of the definition in docs/metrics.md)."""
    rows = con.execute(
        """SELECT e.rank, e.pid, e.tid, e.idx, e.ts_ns, e.ts_ns + e.dur_ns AS end_ns, e.dur_ns,
                  e.name, e.category
           FROM events e JOIN step_spans s USING (run_id, rank, step)
           WHERE e.run_id = ? AND s.steady AND NOT e.on_device AND list_contains(?, e.category)
           ORDER BY e.rank, e.pid, e.tid, e.ts_ns, end_ns DESC, e.idx""",
        [rid, list(TREE_CATEGORIES)],
    ).fetchall()
    own: dict[tuple[int, int], int] = {}
    stack: list[tuple[Any, ...]] = []
    thread = None
    for r in rows:
        if r[:3] != thread:
            stack, thread = [], r[:3]
        while stack and stack[-1][5] <= r[4]:
            stack.pop()
        own.setdefault((r[0], r[3]), r[6])
        if stack and r[6] > 0:
            parent = (stack[-1][0], stack[-1][3])
            own[parent] -= r[6]
        if r[6] > 0:
            stack.append(r)
    out: dict[str, list[int]] = {}
    for r in rows:
        if r[8] == "cpu_op":
            tot = out.setdefault(r[7], [0, 0])
            tot[0] += r[6]
            tot[1] += max(own[(r[0], r[3])], 0)
    return out


def test_self_time_on_a_real_trace(app_store: Path, real_run: str) -> None:
    """Every operator of the shared real GPU trace: the view's total and self time equal a stack
    walk's, and self times of nested autograd wrappers are far below their totals."""
    with open_store(app_store, read_only=True) as con:
        rid, _ = resolve_run(con, real_run)
        v = operators_view(con, rid, limit=100_000)
        want = _stack_self(con, rid)
    got = {r["name"]: [r["total_ns"], r["self_ns"]] for r in v.operators}
    assert len(got) > 20 and got == want
    wrappers = [r for r in v.operators if r["name"].startswith("autograd::engine")]
    assert wrappers and sum(r["self_ns"] for r in wrappers) < 0.5 * sum(
        r["total_ns"] for r in wrappers
    )


def test_operators_layout_self_total_and_group(app_module: Any, real_run: str) -> None:
    """The page's layout, called as Dash calls it: self and total columns; group=shape adds the
    input shapes; an unknown group is a clear error."""
    from tracelab.app import ids
    from tracelab.app.pages import operators

    def find(node: Any, id_: str) -> Any:
        if getattr(node, "id", None) == id_:
            return node
        kids = getattr(node, "children", None)
        for k in kids if isinstance(kids, (list, tuple)) else [kids]:
            if k is not None and not isinstance(k, str) and (hit := find(k, id_)) is not None:
                return hit
        return None

    tree = operators.layout(run=real_run)
    heads = [th.children for th in find(tree, ids.OP_OPS).children.children[0].children.children]
    assert "self" in heads and "total (inclusive)" in heads and "input shapes" not in heads
    fig = find(tree, ids.OP_OPS_CHART).figure
    assert [t["name"] for t in fig["data"]] == ["total (inclusive)", "self"]
    assert all(s <= t for s, t in zip(fig["data"][1]["x"], fig["data"][0]["x"]))
    shaped = operators.layout(run=real_run, group="shape")
    heads = [th.children for th in find(shaped, ids.OP_OPS).children.children[0].children.children]
    assert "input shapes" in heads
    bad = operators.layout(run="stragglers", group="bogus")
    assert "use one of: name, shape" in json.dumps(bad.to_plotly_json(), default=str)


def test_many_ranks_open_on_the_overviews_ranks(
    app_module: Any, app_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Of a run of many ranks the page read every rank's events (17.5 s at 10,000 ranks) and
    its picker listed the first 64 ranks. It opens on the ranks the Overview draws (a typical
    rank, then the straggler with its finding), each a choice with why; 'all' still reads every
    rank. The 40-rank run "many" (rank 33 slow) with the threshold lowered to 32."""
    from tracelab.app import db
    from tracelab.app.pages import operators
    from tracelab.views import operators as operators_module
    from tracelab.views.overview import time_split

    def picker(tree: Any) -> dict[str, tuple[str, bool]]:
        blob = tree.to_plotly_json()
        out: dict[str, tuple[str, bool]] = {}

        def walk(node: Any) -> None:
            if isinstance(node, dict):
                props = node.get("props", {})
                if node.get("type") == "Link":
                    out[str(props.get("children"))] = (
                        props["href"],
                        props.get("className") == "active",
                    )
                for v in props.values() if "props" in node else node.values():
                    walk(v)
            elif isinstance(node, (list, tuple)):
                for x in node:
                    walk(x)
            elif hasattr(node, "to_plotly_json"):
                walk(node.to_plotly_json())

        walk(blob)
        return out

    # 40 ranks are not many: every rank, as before, each rank a choice.
    before = operators.layout(run="many")
    assert "all 40 ranks" in json.dumps(before.to_plotly_json(), default=str)
    assert "39" in picker(before)

    for module in (operators, operators_module):
        monkeypatch.setattr(module, "MANY_RANKS", 32)
    # Not analyzed yet: the page polls while the run is analyzed (it ran the analysis in the
    # request); a page of chosen ranks draws at once, its picker leading back to the
    # Overview's ranks, and starts the analysis for later visits.
    db.ANALYSES.clear()
    waiting = json.dumps(operators.layout(run="many").to_plotly_json(), default=str)
    assert "Analyzing many" in waiting
    chosen = picker(operators.layout(run="many", ranks="7"))
    assert chosen["the Overview's"] == ("/operators?run=many", False) and chosen["7"][1]
    for bad in ("all,3", "3,all"):
        page = json.dumps(operators.layout(run="many", ranks=bad).to_plotly_json(), default=str)
        assert "'all' stands alone" in page
    assert "all 40 ranks" in json.dumps(
        operators.layout(run="many", ranks=" ALL ").to_plotly_json(), default=str
    )
    with db.cursor() as cur:
        rid = db.resolve(cur, "many")[0]
        split = time_split(db.analysis(cur, rid))
        assert split is not None
        drawn = list(zip(split.ranks, split.reasons, strict=True))
        typical = split.ranks[0]
        assert drawn[0] == (typical, "typical") and drawn[1][0] == 33
        expect = operators_view(cur, rid, ranks=tuple(sorted(split.ranks)))
        every = operators_view(cur, rid)
    tree = operators.layout(run="many")
    page = json.dumps(tree.to_plotly_json(), default=str)
    assert "a typical rank and the 1 that stands out, of 40 ranks, as on the Overview" in page
    assert f"ranks {min(typical, 33)}, {max(typical, 33)};" in page
    links = picker(tree)
    assert links["the Overview's"] == ("/operators?run=many", True)
    assert links["all 40"] == ("/operators?run=many&ranks=all", False)
    assert links[f"33 ({drawn[1][1]})"] == ("/operators?run=many&ranks=33", False)
    assert f"{typical} (typical)" in links and "39" not in links
    # The tables are the drawn ranks' (fewer launches than every rank's).
    assert sum(r["n"] for r in expect.kernels) < sum(r["n"] for r in every.kernels)
    calls: list[tuple[int, ...]] = []
    real = operators.operators_view

    def spy(cur: Any, run: int, ranks: tuple[int, ...], *a: Any, **kw: Any) -> Any:
        calls.append(ranks)
        return real(cur, run, ranks, *a, **kw)

    monkeypatch.setattr(operators, "operators_view", spy)
    operators.layout(run="many", steps="1")  # a selection not memoized yet
    assert calls == [tuple(sorted(split.ranks))]
    both = operators.layout(run="many", ranks="all")
    assert "all 40 ranks" in json.dumps(both.to_plotly_json(), default=str)
    assert picker(both)["all 40"][1] and not picker(both)["the Overview's"][1]
    one = operators.layout(run="many", ranks="33")
    ones = picker(one)
    assert ones[f"33 ({drawn[1][1]})"][1] and not ones["the Overview's"][1]
    other = picker(operators.layout(run="many", ranks="5"))
    assert other["5"] == ("/operators?run=many&ranks=5", True)


def test_self_times_equal_a_stack_walk_on_random_trees() -> None:
    """self_times (sorts and prefix sums) against a stack walk over each thread's events in
    start order, on random nested trees over a few threads: children with their parent's exact
    span, zero-length events, threads interleaved in time and in the table; events without a
    tid are not nested (their self time is their duration, as the SQL before had it: a review
    found them nested as one thread, one lane's operators subtracted from another's)."""
    import random

    import pyarrow as pa

    from tracelab.views.operators import self_times

    rng = random.Random(7)
    rows: list[tuple[int, int | None, int, int, int]] = []  # rank, tid, idx, ts, dur

    def tree(rank: int, tid: int | None, lo: int, hi: int, depth: int) -> None:
        t = lo
        while t < hi and len(rows) < 4000:
            a = min(hi, t + rng.randrange(0, 5))
            b = min(hi, a + rng.randrange(0, 40))
            if t == lo and rng.random() < 0.2:
                a, b = lo, hi  # the only child, with its parent's exact span
            rows.append((rank, tid, len(rows), a, b - a))
            if depth < 5 and b - a > 2:
                tree(rank, tid, a, b, depth + 1)
            t = b + rng.randrange(0, 3)

    for rank, tid in ((0, 1), (0, 2), (1, 1), (1, None)):
        tree(rank, tid, 0, 2000, 0)
    rng.shuffle(rows)
    table = pa.table(
        {
            "rank": pa.array([r[0] for r in rows], pa.int32()),
            "pid": pa.array([1] * len(rows), pa.int64()),
            "tid": pa.array([r[1] for r in rows], pa.int64()),
            "idx": pa.array([r[2] for r in rows], pa.int64()),
            "ts_ns": pa.array([r[3] for r in rows], pa.int64()),
            "dur_ns": pa.array([r[4] for r in rows], pa.int64()),
        }
    )
    got = dict(zip((r[2] for r in rows), self_times(table).tolist(), strict=True))
    own: dict[int, int] = {}
    by_thread: dict[tuple[int, int | None], list[tuple[int, int, int]]] = {}
    for rank, tid, idx, ts, dur in rows:
        by_thread.setdefault((rank, tid), []).append((ts, -(ts + dur), idx))
    for (_, tid), events in by_thread.items():
        stack: list[tuple[int, int]] = []  # (idx, end)
        for ts, neg_end, idx in sorted(events):
            end = -neg_end
            if tid is None:  # no thread to nest in: all self, and no one's child
                own[idx] = end - ts
                continue
            while stack and stack[-1][1] <= ts:
                stack.pop()
            own[idx] = end - ts
            if stack and end > ts:
                own[stack[-1][0]] -= end - ts
            if end > ts:
                stack.append((idx, end))
    want = {idx: max(v, 0) for idx, v in own.items()}
    assert len(rows) > 1000 and got == want
    assert sum(1 for r in rows if r[4] == 0) > 10 and any(r[1] is None for r in rows)

    # Children summing past 2^63 (three of nearly 2^62 ns, at one level under overlapping
    # events: the ingest accepts such durations) wrapped the int64 sum: the parent's self
    # time read 4.6e18 ns instead of 0 (a review).
    big = 2**62 - 100
    spans = [(0, 50), (0, 56), (0, 200), (1, 99), (2, big), (55, big), (57, big)]
    odd = pa.table(
        {
            "rank": pa.array([0] * 7, pa.int32()),
            "pid": pa.array([1] * 7, pa.int64()),
            "tid": pa.array([1] * 7, pa.int64()),
            "idx": pa.array(range(7), pa.int64()),
            "ts_ns": pa.array([a for a, _ in spans], pa.int64()),
            "dur_ns": pa.array([d for _, d in spans], pa.int64()),
        }
    )
    assert self_times(odd).tolist()[3] == 0


def test_arrow_reads_after_an_unread_result_on_the_connection(app_store: Path) -> None:
    """Rows as Arrow come through con.sql(), which DuckDB refuses while an earlier execute()'s
    rows are unread (a fetchone() of a one-row query, as run_context's on the app's cursor)."""
    from tracelab.views._sql import arrow

    with open_store(app_store, read_only=True) as con:
        rid, _ = resolve_run(con, "stragglers")
        assert con.execute("SELECT * FROM range(10)").fetchone() == (0,)
        got = arrow(con, "SELECT count(*) AS n FROM events WHERE run_id = $run", {"run": rid})
    assert got.column("n").to_pylist()[0] > 0


@pytest.mark.parametrize("run", ["real-gpu", "pipeline", "stragglers"])
def test_the_kernels_launching_operators_are_an_asof_join(app_store: Path, run: str) -> None:
    """Each runtime launch's operator is found with an ASOF join, whatever DuckDB estimates:
    on this store of many runs it estimated the real trace's 32,335 launches at a few rows and
    planned a nested loop join, 457,804,805 rows and 12.3 s for the page (tracelab.connections).
    Its estimates vary between processes; the other two runs' fall below 64 in every one (a
    review's runs). The app reads through a cursor, as here."""
    from tracelab.store.open import store_cursor
    from tracelab.views import operators as ops
    from tracelab.views._sql import bind, scoped

    with open_store(app_store, read_only=True) as con:
        rid, _ = resolve_run(con, run)
        params = {
            "run": rid,
            "ranks": [],
            "steps": [],
            "limit": ops.TOP_ROWS,
            "dev_cats": list(ops.DEVICE_CATEGORIES),
        }
        cur = store_cursor(con)
        try:
            sql = scoped(cur, ops.KERNELS_SQL, params)
            plan = cur.execute(f"EXPLAIN {sql}", bind(ops.KERNELS_SQL, params)).fetchall()[0][1]
            tiny = cur.execute(
                "EXPLAIN SELECT * FROM range(3) l(t) "
                "ASOF JOIN (SELECT i AS t FROM range(1000) r(i)) r ON l.t >= r.t"
            ).fetchall()[0][1]
        finally:
            cur.close()
    assert "Asof Join" in plan
    assert "Asof Join" in tiny  # a left side of 3 rows, known
