"""Issue 15 proof: a property-based fuzzer over mutated real traces and captures.

Every mutated input must end in exit 0, 2 or 3 without a traceback; a refused ingest leaves
the store exactly as it was; an accepted one leaves `runs` and SQL over every run working and
deletes cleanly. The normal test run draws TRACELAB_FUZZ_EXAMPLES (default 300) examples,
derandomized so that it fails the same way every time; set TRACELAB_FUZZ_EXAMPLES=5000
TRACELAB_FUZZ_RANDOM=1 for a long, random search.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracelab.ingest import ingest

from .fuzz import SEED_TRACES, Store, mutated_capture, mutated_trace
from .kineto import run_set

EXAMPLES = int(os.environ.get("TRACELAB_FUZZ_EXAMPLES", "300"))
RANDOM = os.environ.get("TRACELAB_FUZZ_RANDOM") == "1"
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not RANDOM,
    database=None,
    suppress_health_check=list(HealthCheck),
    print_blob=True,
)


@pytest.fixture(scope="module")
def fuzz_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    for seed in SEED_TRACES:
        if not seed.is_file():
            pytest.fail(f"fuzzer seed missing: {seed}")
    # On tmpfs where there is one: the store's fsyncs then cost nothing, and the examples'
    # time goes to tracelab itself.
    shm = Path("/dev/shm")
    root = (
        Path(tempfile.mkdtemp(prefix="tracelab-fuzz-", dir=shm))
        if shm.is_dir() and os.access(shm, os.W_OK)
        else tmp_path_factory.mktemp("fuzz")
    )
    db = root / "store.duckdb"
    ingest([run_set(root / "good")], db=db, run="good", progress=False)
    yield Store(db)
    shutil.rmtree(root, ignore_errors=True)


@FUZZ
@given(data=st.data())
def test_fuzz_ingest_of_mutated_real_inputs(data: st.DataObject, fuzz_store: Store) -> None:
    with tempfile.TemporaryDirectory(dir=fuzz_store.db.parent) as tmp:
        if data.draw(st.integers(0, 4), label="capture?") == 0:
            path = data.draw(mutated_capture(Path(tmp) / "cap"), label="capture")
        else:
            name, raw = data.draw(mutated_trace(), label="trace")
            path = Path(tmp) / name
            path.write_bytes(raw)
        problem = fuzz_store.check_ingest(path, data.draw(st.booleans(), label="--rank"))
    assert problem is None, problem
