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
