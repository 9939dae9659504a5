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
        for name in ("skip", "hostile", "clean"):
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
