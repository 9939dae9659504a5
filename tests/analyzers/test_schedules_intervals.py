"""Pipeline schedule replay (pure Python) and the interval SQL against a reference model."""

from __future__ import annotations

import random

import duckdb
import numpy as np
import pytest

from tracelab.analyzers import _intervals as iv
from tracelab.analyzers import _schedules as sch


def dur(tf: float, tb: float):
    return lambda a: {"F": tf, "B": tb, "I": tf, "W": tf}[a[1]]


@pytest.mark.parametrize("name,p,m,v,tf,tb,makespan,idle", [
    ("gpipe", 4, 8, 1, 1, 2, 33, 9),
    ("1f1b", 4, 8, 1, 1, 2, 33, 9),
    ("1f1b", 8, 32, 1, 1, 2, 117, 21),
    ("interleaved_1f1b", 4, 8, 2, 0.5, 1, 28.5, 4.5),
    ("zb_h1", 4, 8, 1, 1, 1, 27, 3),
])
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
    assert got["compute_ns"] + got["exposed_comm_ns"] + got["exposed_memcpy_ns"] + got["idle_ns"] \
        == window
    merged = con.execute(f"SELECT t0, t1 FROM ({iv.union_sql('SELECT g, t0, t1 FROM t', 'g')}) "
                         "ORDER BY t0").fetchall()
    assert [tuple(x) for x in merged] == _py_union([(a, b) for _, a, b, _ in rows])


@pytest.mark.parametrize("seed", range(3))
def test_materialized_sweep_equals_the_sql_sweep(seed):
    """The numpy sweep with running totals (materialize_segments + window_sql) against the
    pure-SQL sweep (breakdown_sql) on the intervals clipped to random windows."""
    rng = random.Random(seed)
    con = duckdb.connect()
    con.execute("CREATE TABLE t (rank INTEGER, t0 BIGINT, t1 BIGINT, cls VARCHAR)")
    rows = []
    for _ in range(300):
        a = rng.randrange(0, 2000)
        rows.append((rng.randrange(0, 3), a, a + rng.randrange(0, 60),
                     rng.choice(["compute", "comm", "memcpy"])))
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", rows)
    iv.materialize_segments(con, "seg", "SELECT * FROM t")
    windows = [(r, w0, w0 + rng.randrange(1, 900)) for r in range(3)
               for w0 in rng.sample(range(-50, 2000), 8)]
    con.execute("CREATE TABLE w (rank INTEGER, w0 BIGINT, w1 BIGINT)")
    con.executemany("INSERT INTO w VALUES (?, ?, ?)", windows)
    cols = ["compute_ns", "exposed_comm_ns", "overlapped_comm_ns", "exposed_memcpy_ns"]
    got = {(x[0], x[1], x[2]): x[3:] for x in con.execute(
        f"SELECT rank, w0, w1, {', '.join(cols)}, idle_ns, window_ns FROM "
        f"({iv.window_sql('seg', 'SELECT * FROM w')})").fetchall()}
    for rank, w0, w1 in windows:
        clipped = (f"SELECT rank, greatest(t0, {w0}) AS t0, least(t1, {w1}) AS t1, cls FROM t "
                   f"WHERE rank = {rank} AND t1 > {w0} AND t0 < {w1}")
        ref = con.execute(f"SELECT {', '.join(cols)} FROM "
                          f"({iv.breakdown_sql(clipped, 'rank')})").fetchall()
        ref_vals = ref[0] if ref else (0, 0, 0, 0)
        mine = got[(rank, w0, w1)]
        assert tuple(mine[:4]) == tuple(ref_vals), (rank, w0, w1)
        assert mine[4] == (w1 - w0) - sum(ref_vals[i] for i in (0, 1, 3))
        assert mine[5] == w1 - w0


@pytest.mark.parametrize("seed", range(3))
def test_numpy_window_lookups_equal_window_sql(seed):
    """window_totals and covered (numpy binary searches over the materialized segments) give
    window_sql's (ASOF joins) numbers, windows starting before a rank's first segment and
    ending after its last included."""
    rng = random.Random(seed)
    con = duckdb.connect()
    con.execute("CREATE TABLE t (rank INTEGER, t0 BIGINT, t1 BIGINT, cls VARCHAR)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", [
        (rng.randrange(0, 3), a, a + rng.randrange(0, 60),
         rng.choice(["compute", "comm", "memcpy"]))
        for a in (rng.randrange(0, 2000) for _ in range(300))])
    iv.materialize_segments(con, "seg", "SELECT * FROM t")
    windows = [(r, w0, w0 + rng.randrange(1, 2500)) for r in range(4)
               for w0 in rng.sample(range(-50, 2100), 8)]
    con.execute("CREATE TABLE w (rank INTEGER, w0 BIGINT, w1 BIGINT)")
    con.executemany("INSERT INTO w VALUES (?, ?, ?)", windows)
    cols = ["window_ns", "compute_ns", "exposed_comm_ns", "overlapped_comm_ns", "comm_ns",
            "exposed_memcpy_ns", "idle_ns"]
    ref = con.execute(f"SELECT rank, w0, w1, {', '.join(cols)} FROM "
                      f"({iv.window_sql('seg', 'SELECT * FROM w')})").fetchall()
    ref = {(x[0], x[1], x[2]): x[3:] for x in ref}
    rank, w0, w1 = (np.array([w[i] for w in windows]) for i in range(3))
    got = iv.window_totals(con, "seg", rank, w0, w1)
    exposed = iv.covered(con, "seg", "exposed_comm", rank, w0, w1)
    for i, key in enumerate(windows):
        assert tuple(int(got[c][i]) for c in cols) == tuple(ref[key]), key
        assert int(exposed[i]) == ref[key][2], key
