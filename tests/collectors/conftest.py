"""Fixtures for the collector tests: real torchrun jobs on CPU, a one-rank gloo world in the
test process, and readers for the capture layout (docs/capture-format.md)."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
SCRIPTS = Path(__file__).resolve().parent / "scripts"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True, kw_only=True)
class Capture:
    """A capture folder read back: the manifest, each rank's records and traces."""

    root: Path
    manifest: dict[str, Any]

    @property
    def ranks(self) -> dict[int, dict[str, Any]]:
        return {int(r["rank"]): r for r in self.manifest["ranks"]}

    def records(self, rank: int) -> list[dict[str, Any]]:
        rel = self.ranks[rank]["collectives"]
        lines = (self.root / rel).read_text().splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def trace(self, rank: int, window: int = 0) -> dict[str, Any]:
        rel = self.ranks[rank]["traces"][window]
        with gzip.open(self.root / rel, "rt") as fh:
            return json.load(fh)


def read_capture(root: Path) -> Capture:
    return Capture(root=root, manifest=json.loads((root / "manifest.json").read_text()))


def run_torchrun(
    script: Path,
    *args: str,
    nproc: int = 2,
    timeout: float = 240,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `script` under torchrun on CPU; fail the test with its output if it fails."""
    full_env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "TORCH_SHOW_CPP_STACKTRACES": "0",
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        str(script),
        *args,
    ]
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO
    )
    if proc.returncode != 0:
        pytest.fail(
            f"torchrun {script.name} failed ({proc.returncode}):\n"
            f"{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
        )
    return proc


@pytest.fixture(scope="session")
def torchrun() -> Callable[..., subprocess.CompletedProcess[str]]:
    return run_torchrun


@pytest.fixture(scope="session")
def capture_reader() -> Callable[[Path], Capture]:
    return read_capture


@pytest.fixture
def world1(tmp_path: Path) -> Iterator[Any]:
    """A real one-rank gloo process group in the test process (torn down afterwards)."""
    if dist.is_initialized():
        pytest.skip("a process group is already initialized in this process")
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()
