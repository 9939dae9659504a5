"""The hang verdict on the Overview (tracelab.views.hang, the page's banner), on runs ingested
from real Flight Recorder dumps (tests/hang/captures.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.hang.captures import HOSTILE, capture, hostile_capture
from tracelab.ingest import ingest
from tracelab.store import open_store, run_id
from tracelab.views.analysis import analyze_run
from tracelab.views.hang import HangBanner, hang_banner


@pytest.fixture(scope="module")
def hang_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hang")
    db = folder / "h.duckdb"
    for name, case in (("skip", "skip"), ("kill", "kill"), ("clean", None)):
        ingest([str(capture(folder / name, case, name))], db=str(db), workers=1)
    ingest([str(hostile_capture(folder / "hostile"))], db=str(db), workers=1)
    # Traces that go on past the diverging collective (#5, recorded in step 6 of 8).
    ingest([str(capture(folder / "late", "skip", "late", steps=8))], db=str(db), workers=1)
    return db


@pytest.fixture(scope="module")
def overview(hang_db: Path) -> Iterator[Any]:
    """The Overview page module of the app pointed at hang_db (the app is one per process:
    the store it served before is given back afterwards)."""
    from tracelab.app import create_app
    from tracelab.app import db as appdb

    before = appdb._config.get("db")
    create_app(str(hang_db), warm=False)
    from tracelab.app.pages import overview as page

    with appdb.cursor() as cur:
        for name in ("skip", "hostile", "clean", "late"):
            appdb.analysis(cur, appdb.resolve(cur, name)[0])
    yield page
    if before is None:
        appdb._config.pop("db", None)
    else:
        appdb.configure(before)


def banner(db: Path, run: str) -> HangBanner | None:
    with open_store(db) as con:
        return hang_banner(analyze_run(con, run_id(con, run)))


def texts(node: Any) -> list[str]:
    """Every string in a Dash component tree (what React renders as text nodes)."""
    if isinstance(node, str):
        return [node]
    if isinstance(node, (list, tuple)):
        return [t for n in node for t in texts(n)]
    return texts(getattr(node, "children", None) or [])


def test_the_banner_says_who_never_entered_which_collective(hang_db: Path, overview: Any) -> None:
    b = banner(hang_db, "skip")
    assert b is not None and b.code == "HANG" and b.kind == "The job hangs"
    assert b.title == "rank(s) 1 never entered gloo:all_reduce #5"
    assert dict(b.facts) == {
        "collective": "gloo:all_reduce",
        "sequence number": "5",
        "process group": "0 (ranks 0, 1)",
        "ranks that never entered": "1",
    }
    assert [(r.rank, r.role) for r in b.ranks] == [(0, "entered"), (1, "absent")]
    assert b.ranks[1].text == (
        "rank 1 never entered it; its last op: #4 gloo:all_reduce [1024] Float (scheduled)"
    )
    assert b.ranks[0].where is not None and b.ranks[0].where.endswith("hang_job.py:69")
    assert b.fix.startswith("Rank(s) 1 never issued gloo:all_reduce #5")
    shown = " ".join(texts(overview.hang_box(b)))
    assert b.title in shown and "THE JOB HANGS" in shown and b.ranks[1].text in shown


def test_the_banner_opens_the_overview(overview: Any) -> None:
    """First under the page's title, before the headline and every chart."""
    from tracelab.app import ids

    main = overview.layout(run="skip").children[1]
    first, second = main.children[1], main.children[2]
    assert main.children[0].children == "Overview of skip"
    assert first.id == ids.OV_HANG and second.id == ids.OV_HEADLINE
    assert "rank(s) 1 never entered gloo:all_reduce #5" in texts(first)
    clean = overview.layout(run="clean").children[1]
    assert clean.children[1].id == ids.OV_HEADLINE
    assert all(getattr(c, "id", None) != ids.OV_HANG for c in clean.children)


def test_a_killed_rank_and_a_clean_run(hang_db: Path, overview: Any) -> None:
    b = banner(hang_db, "kill")
    assert b is not None and b.ranks[-1].text == "rank 1 left no dump (it died or was killed)"
    assert banner(hang_db, "clean") is None
    assert overview.hang_box(None) == []


def test_dump_text_stays_text(hang_db: Path, overview: Any) -> None:
    b = banner(hang_db, "hostile")
    assert b is not None and HOSTILE in b.title
    box = overview.hang_box(b)
    # The hostile name reaches Dash only as a plain string child (React renders it as text),
    # never as a component, a property or markup (no dcc.Markdown, no dangerouslySetInnerHTML).
    assert any(HOSTILE in t for t in texts(box))
    assert "Markdown" not in repr(box) and "dangerously" not in repr(box)


def _window_ms(db: Path, run: str) -> dict[int, tuple[float, float]]:
    """step -> its job_steps window in the timeline's ms (the app's clock: ms since the run's
    first event)."""
    from tracelab.views.context import run_context

    with open_store(db) as con:
        rid = run_id(con, run)
        ctx = run_context(con, rid)
        rows = con.execute(
            "SELECT step, start_ns, end_ns FROM job_steps WHERE run_id = ?", [rid]
        ).fetchall()
    return {int(s): (ctx.to_ms(a), ctx.to_ms(b)) for s, a, b in rows}


def _link(node: Any, want: str) -> Any:
    if getattr(node, "id", None) == want:
        return node
    kids = getattr(node, "children", None)
    for kid in kids if isinstance(kids, (list, tuple)) else [kids] if kids is not None else []:
        if (found := _link(kid, want)) is not None:
            return found
    return None


@pytest.mark.parametrize(("run", "step"), [("late", 6), ("skip", 3)])
def test_the_banner_opens_the_timeline_at_the_hang(
    hang_db: Path, overview: Any, run: str, step: int
) -> None:
    """The step that holds the diverging collective (#5 of group 0: step 6 of 8 in 'late'),
    else the run's last step ('skip': #5 is not in its 3 steps), not a steady step."""
    from urllib.parse import parse_qs, urlsplit

    from tracelab.app import ids

    with open_store(hang_db) as con:
        found = analyze_run(con, run_id(con, run))
    assert found.findings[0].code == "HANG" and found.findings[0].evidence.steps == (step,)
    link = _link(overview.layout(run=run), ids.OV_HANG_TIMELINE)
    assert link is not None and link.children == f"Show step {step} in the timeline"
    q = parse_qs(urlsplit(link.href).query)
    t0, t1 = float(q["t0"][0]), float(q["t1"][0])
    windows = _window_ms(hang_db, run)
    a, b = windows[step]
    # The window holds the step of the hang (padded a little), and no other step whole.
    assert t0 <= a and t1 >= b
    assert not any(t0 <= x0 and x1 <= t1 for s, (x0, x1) in windows.items() if s != step)
    assert q["run"] == [run]
