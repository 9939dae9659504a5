"""Fixtures shared by every test package: where the shared real traces live."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("TRACELAB_SHARED", REPO.parent / "shared"))
HTA_TRACES = SHARED / "traces" / "hta"


@pytest.fixture(scope="session")
def hta_traces() -> Path:
    """../shared/traces/hta: real GPU traces from HTA's test data (read, never copied)."""
    if not HTA_TRACES.is_dir():
        pytest.fail(f"shared traces missing at {HTA_TRACES}; set TRACELAB_SHARED")
    return HTA_TRACES


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `torchrun` (real multi-rank jobs) run on one xdist worker, one after
    another (`--dist loadgroup`). Two 4-rank jobs at once oversubscribe a 2-core runner, and
    then what the diagnosis and the report's A/A gate measure is the other job's load: in one
    full run an A/A rerun of the same training came out 77% slower (aten::mm 4.5x). Grouped,
    the diagnosis captures are also made once per test run, not once per worker.

    Tests marked `ray` share one Ray cluster (a module fixture): on one worker, the cluster is
    started once, and no worker's teardown can stop a cluster another worker still uses.

    tryfirst: xdist reads the xdist_group marks in its own pytest_collection_modifyitems (it
    appends "@group" to the node ids), which must come after this one."""
    for item in items:
        if item.get_closest_marker("torchrun") is not None:
            item.add_marker(pytest.mark.xdist_group("torchrun"))
        elif item.get_closest_marker("ray") is not None:
            item.add_marker(pytest.mark.xdist_group("ray"))


@pytest.fixture(autouse=True)
def _grouped_on_one_worker(request: pytest.FixtureRequest) -> None:
    """On an xdist worker under --dist loadgroup, a grouped test fails unless the grouping took:
    pytest 9.2 made xdist's "@group" node-id suffix a no-op (pytest-dev/pytest-xdist#1386), and
    the torchrun tests then ran on both workers, each making its own captures beside the
    other's (two 4-rank jobs on 2 cores: the load-sensitive diagnosis tests failed in CI)."""
    config = request.config
    item = request.node
    if (
        hasattr(config, "workerinput")
        and config.getvalue("loadgroup")
        and item.get_closest_marker("xdist_group") is not None
        and "@" not in item.nodeid
    ):
        pytest.fail(
            f"pytest-xdist's --dist loadgroup is not grouping under pytest {pytest.__version__} "
            "(pytest-dev/pytest-xdist#1386): install the test extra, which pins pytest<9.2."
        )
