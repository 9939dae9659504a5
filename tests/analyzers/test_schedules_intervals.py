"""Pipeline schedule replay (pure Python) and the interval SQL against a reference model."""

from __future__ import annotations

import random

import duckdb
import numpy as np
import pytest

from tracelab.derived import intervals as iv
from tracelab.derived import schedules as sch
from tracelab.derived import sqlfiles


def dur(tf: float, tb: float):
    return lambda a: {"F": tf, "B": tb, "I": tf, "W": tf}[a[1]]


@pytest.mark.parametrize(
    "name,p,m,v,tf,tb,makespan,idle",
    [
        ("gpipe", 4, 8, 1, 1, 2, 33, 9),
        ("1f1b", 4, 8, 1, 1, 2, 33, 9),
        ("1f1b", 8, 32, 1, 1, 2, 117, 21),
        ("interleaved_1f1b", 4, 8, 2, 0.5, 1, 28.5, 4.5),
        ("zb_h1", 4, 8, 1, 1, 1, 27, 3),
    ],
)
def test_replay_oracles(name, p, m, v, tf, tb, makespan, idle):
    rp = sch.replay(sch.make_order(name, p, m, v), dur(tf, tb))
    assert rp.makespan == pytest.approx(makespan)
    assert all(rp.idle(r) == pytest.approx(idle) for r in range(p))
    share, mega = sch.bubble_formula(name, p, m, v)
    assert share == pytest.approx(idle / makespan)
    assert mega == pytest.approx(idle / (makespan - idle))


def test_1f1b_warmup_matches_torch():
    # torch's Schedule1F1B: stage s runs min(m, p - s) forwards before its first backward.
    order = sch.one_f_one_b(4, 8)
    for s, acts in order.items():
        first_b = next(i for i, a in enumerate(acts) if a[1] == "B")
        assert first_b == min(8, 4 - s)


def test_zb_h1_keeps_1f1b_memory_limit():
    for s, acts in sch.zb_h1(4, 8).items():
        inflight = peak = 0
        for _, kind, _ in acts:
            inflight += {"F": 1, "I": -1, "W": 0}[kind]
            peak = max(peak, inflight)
        assert peak == 4 - s


def test_deadlocking_order_is_an_error():
    with pytest.raises(ValueError, match="deadlocks"):
        sch.replay({0: [(0, "B", 0), (0, "F", 0)], 1: [(1, "F", 0), (1, "B", 0)]}, dur(1, 1))


def _py_union(ivs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(ivs):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [tuple(x) for x in out]


def _length(ivs: list[tuple[int, int]]) -> int:
    return sum(b - a for a, b in ivs)


def _intersect(x: list[tuple[int, int]], y: list[tuple[int, int]]) -> int:
    return sum(max(0, min(b, d) - max(a, c)) for a, b in x for c, d in y)


@pytest.mark.parametrize("seed", range(5))
def test_sweep_matches_a_reference_model(seed):
    rng = random.Random(seed)
    rows = []
    for _ in range(60):
        a = rng.randrange(0, 1000)
        rows.append((0, a, a + rng.randrange(0, 80), rng.choice(["compute", "comm", "memcpy"])))
    con = duckdb.connect()
    con.execute("CREATE TABLE t (g INTEGER, t0 BIGINT, t1 BIGINT, cls VARCHAR)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", rows)
    got = con.execute(iv.breakdown_sql("SELECT * FROM t", "g")).fetchall()[0]
    cols = [d[0] for d in con.description]
    got = dict(zip(cols, got, strict=True))
    by = {c: _py_union([(a, b) for _, a, b, k in rows if k == c]) for c in iv.CLASSES}
    window = max(b for _, _, b, _ in rows) - min(a for _, a, _, _ in rows)
    comp, comm = _length(by["compute"]), _length(by["comm"])
    overlapped = _intersect(by["compute"], by["comm"])
    assert got["window_ns"] == window
    assert got["compute_ns"] == comp
    assert got["comm_ns"] == comm
    assert got["overlapped_comm_ns"] == overlapped
    assert got["exposed_comm_ns"] == comm - overlapped
    busy = _length(_py_union([(a, b) for _, a, b, _ in rows]))
    assert got["idle_ns"] == window - busy
    assert (
        got["compute_ns"] + got["exposed_comm_ns"] + got["exposed_memcpy_ns"] + got["idle_ns"]
        == window
    )
    sqlfiles.create_macros(con, store=False)
    merged = con.execute(
        "WITH s AS (SELECT g AS k, t0, t1 FROM t) SELECT t0, t1 FROM interval_union(s) ORDER BY t0"
    ).fetchall()
    # Empty intervals cover nothing: the union drops them.
    assert [tuple(x) for x in merged] == _py_union([(a, b) for _, a, b, _ in rows if b > a])


@pytest.mark.parametrize("seed", range(5))
def test_numpy_union_equals_the_sql_union(seed):
    """intervals.union (the numpy sweep the parts use on whole runs) against the SQL macro
    interval_union (tracelab/derived/sql/_macros.sql) and the
    reference model, per key, touching and nested intervals included."""
    rng = random.Random(seed)
    rows = [
        (rng.randrange(0, 3), a, a + rng.randrange(0, 60))
        for a in (rng.randrange(0, 2000) for _ in range(300))
    ]
    key, t0, t1 = (np.array([r[i] for r in rows], dtype=np.int64) for i in range(3))
    k, a, b = iv.union(key, t0, t1)
    got = sorted(zip(k.tolist(), a.tolist(), b.tolist()))
    ref = sorted(
        (g, x, y)
        for g in range(3)
        for x, y in _py_union([(x, y) for gg, x, y in rows if gg == g and y > x])
    )
    assert got == ref
    con = duckdb.connect()
    con.execute("CREATE TABLE t (g INTEGER, t0 BIGINT, t1 BIGINT)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    sqlfiles.create_macros(con, store=False)
    sql = sorted(
        tuple(x)
        for x in con.execute(
            "WITH s AS (SELECT g AS k, t0, t1 FROM t) SELECT k, t0, t1 FROM interval_union(s)"
        ).fetchall()
    )
    assert sql == ref
    one = key == 0
    assert iv.total(t0[one], t1[one]) == sum(y - x for g, x, y in ref if g == 0)
