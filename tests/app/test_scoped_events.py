"""The views' queries filtered to a few ranks read those ranks' files, and those over a run of a
few ranks that run's files, not the `events` view (tracelab.views._sql.events_source): the view
names every file of the store, other runs' too, and a query on it binds that whole list (at
10,000 ranks a timeline of two ranks took 8.5-12.8 s, one rank's operators 22.6 s; beside 14
small runs the 8-rank set's timeline took 0.54-0.67 s against 0.47 s). The rows must be the
same either way."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tracelab.store import open_store, run_id
from tracelab.views import _sql
from tracelab.views import timeline as tl
from tracelab.views.context import run_context
from tracelab.views.operators import operators_view


def _views(con, rid: int, ranks: tuple[int, ...]):  # type: ignore[no-untyped-def]
    ctx = run_context(con, rid)
    raw = tl.timeline(con, ctx, tl.TimelineRequest(ranks=ranks))
    steps = tl.timeline(con, ctx, tl.TimelineRequest(ranks=ranks, steps=(2,)))
    limit, tl.RAW_EVENT_LIMIT = tl.RAW_EVENT_LIMIT, 2  # the same window, binned
    try:
        binned = tl.timeline(con, ctx, tl.TimelineRequest(ranks=ranks, width_px=60))
    finally:
        tl.RAW_EVENT_LIMIT = limit
    assert raw.mode == "raw" and raw.raw is not None and binned.mode == "aggregate"
    details = [
        tl.event_detail(con, ctx, r, i) for r, i in zip(raw.raw.rank, raw.raw.idx, strict=True)
    ]
    assert details and all(d is not None for d in details)
    return (
        raw,
        steps,
        binned,
        details,
        operators_view(con, rid, ranks=ranks),
        operators_view(con, rid, ranks=ranks, by_shape=True),
    )


@pytest.mark.parametrize("run", ["stragglers", "pipeline", "overlap_gloo"])
def test_a_few_ranks_read_their_own_files_with_the_same_rows(
    app_store: Path, run: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with open_store(app_store) as con:
        rid = run_id(con, run)
        ranks = (0, 1)
        src = _sql.events_source(con, {"run": rid, "ranks": list(ranks)})
        assert "read_parquet" in src and "rank=0/" in src and "rank=2/" not in src
        whole = _sql.events_source(con, {"run": rid, "ranks": []})  # every rank of the run
        assert set(re.findall(r"run=(\d+)/", whole)) == {str(rid)}
        run_ranks = con.execute("SELECT rank FROM ranks WHERE run_id = ?", [rid]).fetchall()
        assert all(f"rank={r}/" in whole for (r,) in run_ranks)
        scoped = _views(con, rid, ranks), _views(con, rid, ())
        parts = _sql.parts_source(con, {"run": rid})  # the run's time_parts files
        assert "read_parquet" in parts and set(re.findall(r"run=(\d+)/", parts)) == {str(rid)}
        monkeypatch.setattr(_sql, "SCOPED_RANKS", 0)  # every query reads the views
        monkeypatch.setattr(_sql, "parts_source", lambda con, params: "time_parts")
        assert _sql.events_source(con, {"run": rid, "ranks": list(ranks)}) == "events"
        assert _sql.events_source(con, {"run": rid, "ranks": []}) == "events"
        viewed = _views(con, rid, ranks), _views(con, rid, ())
    for got, want in zip(scoped, viewed, strict=True):
        assert got[0].raw.idx and (got[4].operators or got[4].kernels)  # things to read
        assert got[0].parts.mode != "none"  # segments to read
        for a, b in zip(got, want, strict=True):
            assert a == b
