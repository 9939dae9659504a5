"""Real headless Chromium (selenium 4 + /usr/bin/chromedriver) against `tracelab serve`.

Each view loads, the timeline zooms (aggregates -> single events), a finding's link opens the
timeline at its evidence, bad URLs show a friendly page, and the XSS probe renders as text.
Screenshots go to artifacts/screenshots/.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import pytest

REPO = Path(__file__).resolve().parents[2]
SCREENSHOTS = REPO / "artifacts" / "screenshots"
PROBE = "<img src=x onerror=alert(1)>"  # as written into the "xss" run by conftest.xss_run

pytestmark = pytest.mark.browser

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
if not CHROMIUM.exists() or not CHROMEDRIVER.exists():
    pytest.skip("needs Debian chromium and chromium-driver (/usr/bin/chromium, "
                "/usr/bin/chromedriver): apt-get install -y chromium chromium-driver",
                allow_module_level=True)

from selenium import webdriver
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

#: How long to wait for a page. A first render runs every analyzer on its run, which on a
#: 2-core machine shared with torchrun tests has taken over 30 s; speed is measured in
#: benchmarks/app.py, not here, and a ready page ends the wait at once.
TIMEOUT_S = 90


@pytest.fixture(scope="module")
def driver() -> Iterator[webdriver.Chrome]:
    profile = tempfile.mkdtemp(prefix="tracelab-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 f"--user-data-dir={profile}", "--window-size=1400,1000"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    drv = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)
    drv.set_page_load_timeout(TIMEOUT_S)
    yield drv
    drv.quit()
    shutil.rmtree(profile, ignore_errors=True)


def wait(drv: webdriver.Chrome) -> WebDriverWait:
    """A wait that polls again when Dash re-renders the element a condition was reading
    (a stale element means "not ready yet", not a failure)."""
    return WebDriverWait(drv, TIMEOUT_S, ignored_exceptions=(StaleElementReferenceException,))


def shot(drv: webdriver.Chrome, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    height = drv.execute_script("return document.body.scrollHeight") or 1000
    drv.set_window_size(1400, min(max(int(height), 1000), 4000))
    drv.save_screenshot(str(SCREENSHOTS / f"{name}.png"))
    drv.set_window_size(1400, 1000)


def console_errors(drv: webdriver.Chrome) -> list[str]:
    return [e["message"] for e in drv.get_log("browser")
            if e["level"] == "SEVERE" and "favicon" not in e["message"]]


def open_page(drv: webdriver.Chrome, url: str, heading: str, graphs: int = 0) -> None:
    """Navigate and wait until the page's H1 says `heading` and `graphs` plots have drawn."""
    drv.get(url)

    def ready(d: webdriver.Chrome) -> bool:
        h1 = d.find_elements(By.CSS_SELECTOR, "main h1")
        if not h1 or heading not in h1[0].text:
            return False
        return len(d.find_elements(By.CSS_SELECTOR, ".js-plotly-plot .main-svg")) >= graphs

    wait(drv).until(ready)


def graph_range(drv: webdriver.Chrome, graph_id: str) -> list[float]:
    return drv.execute_script(
        "const gd = document.getElementById(arguments[0]).querySelector('.js-plotly-plot');"
        "return gd._fullLayout.xaxis.range;", graph_id)


def no_alert(drv: webdriver.Chrome) -> bool:
    try:
        _ = drv.switch_to.alert
    except NoAlertPresentException:
        return True
    return False


VIEWS = [
    ("runs", "/", "Runs", 0),
    ("overview", "/overview?run=stragglers", "Overview of stragglers", 2),
    ("timeline", "/timeline?run=stragglers", "Timeline of stragglers", 1),
    ("pipeline", "/pipeline?run=pipeline", "Pipeline of pipeline", 2),
    ("stragglers", "/stragglers?run=stragglers", "Stragglers of stragglers", 3),
    ("memory", "/memory?run=pipeline", "Memory of pipeline", 3),
    ("compare", "/compare?a=stragglers&b=pipeline", "Compare stragglers (A)", 1),
]


@pytest.mark.parametrize("name,path,heading,graphs", VIEWS, ids=[v[0] for v in VIEWS])
def test_each_view_loads(server: str, driver: webdriver.Chrome, name: str, path: str,
                         heading: str, graphs: int) -> None:
    driver.get_log("browser")
    open_page(driver, server + path, heading, graphs)
    body = driver.find_element(By.TAG_NAME, "body").text
    assert "Something went wrong" not in body and "Traceback" not in body
    if name == "runs":
        wait(driver).until(
            lambda d: "STRAGGLER_COMPUTE" in d.find_element(By.ID, "runs-table").text)
    shot(driver, f"view-{name}")
    assert console_errors(driver) == []


def test_sample_captures_load(server: str, driver: webdriver.Chrome,
                              sample_runs: list[str]) -> None:
    if not sample_runs:
        pytest.skip("sample_traces/ has no captures yet (the collectors produce them)")
    for name in sample_runs:
        views = [("overview", "Overview of", 2), ("timeline", "Timeline of", 1)]
        if "pipeline" in name:
            views.append(("pipeline", "Pipeline of", 2))
        if "slow_rank" in name:
            views.append(("stragglers", "Stragglers of", 3))
        if "unbalanced" in name:
            views.append(("memory", "Memory of", 2))
        for view, heading, graphs in views:
            open_page(driver, f"{server}/{view}?run={name}", heading, graphs)
            assert "Something went wrong" not in driver.find_element(By.TAG_NAME, "body").text
            shot(driver, f"{name}-{view}")


def test_timeline_zooms_from_aggregates_to_events(server: str, driver: webdriver.Chrome,
                                                  real_run: str) -> None:
    open_page(driver, server + "/timeline?run=real-gpu", "Timeline of real-gpu", 1)
    status = driver.find_element(By.ID, "timeline-status")
    assert status.text.startswith("Showing aggregates")
    shot(driver, "timeline-aggregates")
    lo, hi = graph_range(driver, "timeline-graph")
    mid = (lo + hi) / 2
    started = time.perf_counter()
    driver.execute_script(
        "const gd = document.getElementById('timeline-graph').querySelector('.js-plotly-plot');"
        "Plotly.relayout(gd, {'xaxis.range[0]': arguments[0], 'xaxis.range[1]': arguments[1]});",
        mid, mid + 0.4)
    wait(driver).until(
        lambda d: d.find_element(By.ID, "timeline-status").text.startswith("Showing all"))
    elapsed = time.perf_counter() - started
    assert graph_range(driver, "timeline-graph") == pytest.approx([mid, mid + 0.4], rel=1e-6)
    query = parse_qs(urlparse(driver.current_url).query)
    assert float(query["t0"][0]) == pytest.approx(mid, rel=1e-5)
    assert query["run"] == ["real-gpu"]
    shot(driver, "timeline-zoomed")
    assert elapsed < 10, f"zoom took {elapsed:.1f} s"
    # The shared URL reproduces the zoomed view.
    driver.get(driver.current_url)
    wait(driver).until(
        lambda d: d.find_elements(By.ID, "timeline-status")
        and d.find_element(By.ID, "timeline-status").text.startswith("Showing all"))
    assert graph_range(driver, "timeline-graph") == pytest.approx([mid, mid + 0.4], rel=1e-4)


def test_finding_link_opens_its_evidence(server: str, driver: webdriver.Chrome) -> None:
    open_page(driver, server + "/overview?run=stragglers", "Overview of stragglers", 2)
    finding = next(li for li in driver.find_elements(By.CSS_SELECTOR, "li.finding")
                   if "STRAGGLER_COMPUTE" in li.text)
    link = finding.find_element(By.LINK_TEXT, "Show in timeline")
    link.click()
    wait(driver).until(lambda d: "/timeline" in d.current_url)
    open_wait = wait(driver)
    open_wait.until(lambda d: d.find_elements(By.ID, "timeline-status")
                    and "Showing" in d.find_element(By.ID, "timeline-status").text)
    query = parse_qs(urlparse(driver.current_url).query)
    assert query["ranks"] == ["2"]
    t0, t1 = float(query["t0"][0]), float(query["t1"][0])
    assert graph_range(driver, "timeline-graph") == pytest.approx([t0, t1], rel=1e-4)
    ticks = driver.execute_script(
        "return Array.from(document.querySelectorAll('#timeline-graph .ytick text'))"
        ".map(e => e.textContent);")
    assert ticks and all(t.startswith("r2 ") for t in ticks)
    shot(driver, "finding-link-timeline")


def test_xss_probe_renders_as_text(server: str, driver: webdriver.Chrome) -> None:
    open_page(driver, server + "/timeline?run=xss", "Timeline of xss", 1)
    ticks = driver.execute_script(
        "return Array.from(document.querySelectorAll('#timeline-graph .ytick text'))"
        ".map(e => e.textContent);")
    assert any(PROBE in t for t in ticks), ticks
    # Hover an event whose name is the probe: the hover label shows it as text.
    hover = driver.execute_script(
        "const gd = document.getElementById('timeline-graph').querySelector('.js-plotly-plot');"
        "const i = gd.data.findIndex(t => t.name === 'compute');"
        "Plotly.Fx.hover(gd, [{curveNumber: i, pointNumber: 0}]);"
        "return Array.from(document.querySelectorAll('.hoverlayer text')).map(e => e.textContent).join(' ');")
    assert PROBE in hover
    # Click it: the detail panel prints the name as text.
    driver.execute_script(
        "const gd = document.getElementById('timeline-graph').querySelector('.js-plotly-plot');"
        "const i = gd.data.findIndex(t => t.name === 'compute');"
        "gd.emit('plotly_click', {points: [{curveNumber: i, pointNumber: 0,"
        " customdata: gd.data[i].customdata[0]}]});")
    wait(driver).until(
        lambda d: PROBE in d.find_element(By.ID, "timeline-detail").text)
    assert driver.execute_script("return document.querySelectorAll('img[src=\"x\"]').length") == 0
    assert no_alert(driver)
    shot(driver, "xss-probe")


def test_many_ranks_open_on_a_rank_summary(server: str, driver: webdriver.Chrome) -> None:
    open_page(driver, server + "/timeline?run=many", "Timeline of many", 1)
    status = driver.find_element(By.ID, "timeline-status").text
    assert "40 ranks are too many" in status and "rank 33" in status
    shot(driver, "timeline-rank-summary")
    driver.find_element(By.ID, "timeline-rank-summary").click()
    wait(driver).until(
        lambda d: d.find_elements(By.ID, "timeline-status")
        and d.find_element(By.ID, "timeline-status").text.startswith("Showing"))
    ticks = driver.execute_script(
        "return Array.from(document.querySelectorAll('#timeline-graph .ytick text'))"
        ".map(e => e.textContent.split(' ')[0]);")
    assert "r33" in ticks and len(set(ticks)) == 2
    ranks = parse_qs(urlparse(driver.current_url).query)["ranks"][0].split(",")
    assert "33" in ranks and len(ranks) == 2


@pytest.mark.parametrize("path,message", [
    ("/timeline?run=stragglers&t0=abc", "must be a number"),
    ("/overview?run=no-such-run", "no run named"),
    ("/nowhere", "No such page"),
])
def test_bad_urls_show_a_friendly_page(server: str, driver: webdriver.Chrome, path: str,
                                       message: str) -> None:
    driver.get(server + path)
    wait(driver).until(
        lambda d: message in d.find_element(By.TAG_NAME, "body").text)
    assert "Traceback" not in driver.find_element(By.TAG_NAME, "body").text
    shot(driver, "friendly-" + path.strip("/").split("?")[0].replace("/", "-") or "root")

