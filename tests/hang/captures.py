"""Captures with real Flight Recorder dumps for the ingest and app tests: a synthetic 2-rank gloo
capture (tracelab.testing.synth) with one of tests/hang/fixtures' cases in flight-recorder/."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from tracelab.testing.synth import build_run

FIX = Path(__file__).parent / "fixtures"
#: What the hostile dump names its collective: it must stay text everywhere.
HOSTILE = "<script>window.hacked=1</script><img src=x onerror=alert(1)>"


def capture(
    folder: Path, case: str | None, name: str = "cap", steps: int = 3, ranks: int = 2
) -> Path:
    """A gloo capture of `ranks` ranks (manifest world_size the same) of `steps` steps, with
    `case`'s dumps in flight-recorder/. Its collector records all-reduce #k of group '0' in step
    k + 1 (the 2-rank fixtures' verdicts are at #5: in step 6 when there are that many steps)."""
    root = build_run(
        folder,
        "stragglers",
        arrivals_ms=tuple(range(ranks)),
        backend="gloo",
        capture=True,
        steps=steps,
        name=name,
    ).paths[0]
    if case is not None:
        shutil.copytree(FIX / case, Path(root) / "flight-recorder")
    return Path(root)


def hostile_capture(
    folder: Path,
    op: str = HOSTILE,
    name: str = "hostile",
    frames: list[dict[str, object]] | None = None,
) -> Path:
    """The skip case with its collective named `op` (markup by default) in each rank's JSON
    dump, and each entry's Python stack `frames` ({name, filename, line}) when given."""
    root = capture(folder, None, name)
    out = root / "flight-recorder"
    out.mkdir()
    for r in (0, 1):
        doc = json.loads((FIX / "skip" / f"rank_{r}.json").read_text())
        for e in doc["entries"]:
            e["profiling_name"] = op
            if frames is not None:
                e["frames"] = frames
        (out / f"rank_{r}.json").write_text(json.dumps(doc))
    return root
