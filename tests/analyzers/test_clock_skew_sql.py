"""The clocks analyzer's skew (a rank's arrival minus the median arrival of the match's other
ranks, its median over matches) against a brute-force model on random matches."""

from __future__ import annotations

import random
import statistics

import duckdb
import pytest

from tracelab.analyzers import clocks


@pytest.mark.parametrize("seed", range(4))
def test_others_median_skew_is_exact(seed: int) -> None:
    rng = random.Random(seed)
    con = duckdb.connect()
    con.execute(
        "CREATE TABLE matched_collectives (run_id INT, match_key VARCHAR, rank INT, "
        "start_ns BIGINT)"
    )
    con.execute(
        "CREATE TABLE clock_offsets (run_id INT, rank INT, offset_ns BIGINT, host "
        "VARCHAR, method VARCHAR, uncertainty_ns BIGINT, matches INT, "
        "causality_violations INT)"
    )
    ranks = 7
    rows = [
        (1, f"k{k}", r, rng.randint(0, 50))
        for k in range(40)
        for r in rng.sample(range(ranks), rng.randint(1, ranks))
    ]
    con.executemany("INSERT INTO matched_collectives VALUES (?, ?, ?, ?)", rows)
    offs = {r: rng.randint(-5, 5) for r in range(ranks)}
    con.executemany(
        "INSERT INTO clock_offsets VALUES (1, ?, ?, NULL, 'x', 0, 0, 0)", list(offs.items())
    )
    got = {r[0]: (r[7], r[8]) for r in con.execute(clocks._RANKS_SQL, {"run": 1}).fetchall()}
    by: dict[str, dict[int, int]] = {}
    for _, key, rank, at in rows:
        by.setdefault(key, {})[rank] = at
    raw: dict[int, list[float]] = {}
    aligned: dict[int, list[float]] = {}
    for arrivals in by.values():
        for rank, at in arrivals.items():
            others = {o: v for o, v in arrivals.items() if o != rank}
            if others:
                aligned.setdefault(rank, []).append(at - statistics.median(others.values()))
                raw.setdefault(rank, []).append(
                    at + offs[rank] - statistics.median(v + offs[o] for o, v in others.items())
                )
    assert raw
    for rank in raw:
        assert got[rank][0] == pytest.approx(statistics.median(raw[rank]))
        assert got[rank][1] == pytest.approx(statistics.median(aligned[rank]))
