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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked `torchrun` (real multi-rank jobs) run on one xdist worker, one after
    another (`--dist loadgroup`). Two 4-rank jobs at once oversubscribe a 2-core runner, and
    then what the diagnosis and the report's A/A gate measure is the other job's load: in one
    full run an A/A rerun of the same training came out 77% slower (aten::mm 4.5x). Grouped,
    the diagnosis captures are also made once per test run, not once per worker.

    Tests marked `ray` share one Ray cluster (a module fixture): on one worker, the cluster is
    started once, and no worker's teardown can stop a cluster another worker still uses."""
    for item in items:
        if item.get_closest_marker("torchrun") is not None:
            item.add_marker(pytest.mark.xdist_group("torchrun"))
        elif item.get_closest_marker("ray") is not None:
            item.add_marker(pytest.mark.xdist_group("ray"))
