"""The hang verdict in real headless Chromium: the Overview of a run ingested with Flight
Recorder dumps opens on the verdict's banner, inside the first frame (1600x1000), and a dump
whose collective is named like markup renders as text (no script runs, no image loads)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.app.test_app_browser import driver, no_alert, open_page, shot  # noqa: F401
from tests.hang.captures import HOSTILE, capture, hostile_capture
from tracelab.ingest import ingest

pytestmark = pytest.mark.browser

from selenium.webdriver.common.by import By  # noqa: E402


@pytest.fixture(scope="module")
def hang_server(tmp_path_factory: pytest.TempPathFactory, start_app_server: Any) -> Iterator[str]:
    folder = tmp_path_factory.mktemp("hangapp")
    db = folder / "h.duckdb"
    ingest([str(capture(folder / "a", "skip", "hung-job"))], db=str(db), workers=1)
    ingest([str(hostile_capture(folder / "b"))], db=str(db), workers=1)
    proc, url = start_app_server(db, folder / "serve.log")
    yield url
    proc.terminate()
    proc.wait(10)


def test_the_overview_opens_on_the_hang_verdict(hang_server: str, driver: Any) -> None:  # noqa: F811
    open_page(driver, hang_server + "/overview?run=hung-job", "Overview of hung-job", 2)
    box = driver.find_element(By.ID, "overview-hang")
    assert "rank(s) 1 never entered gloo:all_reduce #5" in box.text
    assert "THE JOB HANGS" in box.text and "Fix:" in box.text
    # In the first frame, right under the title, above the headline and the charts.
    rect = driver.execute_script(
        "const r = document.getElementById('overview-hang').getBoundingClientRect();"
        "const h = document.getElementById('overview-headline').getBoundingClientRect();"
        "return [r.top, r.bottom, h.top, window.innerHeight];"
    )
    top, bottom, headline_top, height = rect
    assert 0 <= top and bottom <= height and bottom <= headline_top, rect
    shot(driver, "overview-hang")


def test_dump_text_renders_as_text(hang_server: str, driver: Any) -> None:  # noqa: F811
    open_page(driver, hang_server + "/overview?run=hostile", "Overview of hostile", 2)
    box = driver.find_element(By.ID, "overview-hang")
    assert HOSTILE in box.text
    assert driver.execute_script("return window.hacked === undefined")
    assert driver.execute_script("return document.querySelectorAll('img[src=\"x\"]').length") == 0
    assert not driver.find_elements(By.CSS_SELECTOR, "#overview-hang script")
    assert no_alert(driver)
    shot(driver, "overview-hang-hostile")
