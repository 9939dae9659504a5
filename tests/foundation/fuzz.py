"""Mutations of real traces and captures for the hostile-input fuzzer (issue 15).

Seeds are small real traces (sample_traces/, the shared HTA traces) and a real capture
(sample_traces/ddp). A mutation is drawn by hypothesis: byte edits of the JSON text, or a
value deep inside the document replaced by something hostile (numbers past every range, wrong
JSON types, lone surrogates, deep nesting, control characters), written raw where JSON needs
it; the result is sometimes gzipped. `Store.check_ingest` runs `tracelab ingest` on it, in
this process, against a store holding other runs, and says what broke.
"""

from __future__ import annotations

import gzip
import json
import shutil
from functools import cache
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from tracelab.store import open_store

from .hostile import CLEAN_EXITS, REPO, cli

HTA = Path(__file__).resolve().parents[2].parent / "shared" / "traces" / "hta"
SEED_TRACES = (
    REPO / "sample_traces/ddp/rank-0/window-0.pt.trace.json.gz",
    REPO / "sample_traces/tensor_parallel/rank-1/window-0.pt.trace.json.gz",
    HTA / "triton_example/triton_example.json.gz",
    HTA / "cpu_only/rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz",
    HTA / "critical_path/cuda_event_sync/event_sync_trace.json.gz",
    HTA / "amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz",
)
SEED_CAPTURE = REPO / "sample_traces/ddp"

#: Raw JSON texts of hostile values (written verbatim, so they can be what json.dumps refuses).
HOSTILE_RAW = (
    "1e400",
    "-1e400",
    "1e30",
    "-1e30",
    str(2**63),
    str(2**63 - 1),
    str(-(2**63)),
    str(2**64),
    str(2**31),
    str(-(2**31) - 1),
    "9e15",
    "4.6e15",
    "-1",
    "0",
    "1.5",
    "-0.0",
    "null",
    "true",
    "false",
    '""',
    '"0"',
    '"1"',
    "[]",
    "{}",
    "[1]",
    '{"a": 1}',
    '"\\ud800"',
    '"x\\udc00y"',
    '"\\u0000"',
    '"\\u001b]0;owned\\u0007\\u001b[2J"',
    "[" * 600 + "]" * 600,
    "[" * 3000 + "]" * 3000,
    '"' + "a" * 70000 + '"',
    '"ProfilerStep#2147483648"',
    '"ProfilerStep#99999999999999999999"',
    '"../../etc/passwd"',
    '"/etc/passwd"',
    '"rank-0/window-0.pt.trace.json.gz"',
)


@cache
def seed_text(path: Path) -> str:
    return gzip.decompress(path.read_bytes()).decode()


@cache
def seed_doc(path: Path) -> Any:
    return json.loads(seed_text(path))


@st.composite
def json_edit(draw: st.DrawFn, doc: Any) -> str:
    """`doc` as JSON text with one value (or key) somewhere inside replaced or removed."""
    doc = json.loads(json.dumps(doc))
    raw = draw(st.sampled_from(HOSTILE_RAW))
    node, depth = doc, 0
    while isinstance(node, (dict, list)) and node and depth < 6:
        keys = list(node) if isinstance(node, dict) else list(range(len(node)))
        if isinstance(node, list) and depth == 1:  # traceEvents: any event, not only early
            key = draw(st.integers(0, len(keys) - 1))
        else:
            key = draw(st.sampled_from(keys))
        child = node[key]
        if not isinstance(child, (dict, list)) or not child or draw(st.booleans()):
            action = draw(st.sampled_from(("replace", "replace", "replace", "delete")))
            if action == "delete" and isinstance(node, dict):
                del node[key]
            else:
                node[key] = "\x00RAW\x00"
            break
        node, depth = child, depth + 1
    text = json.dumps(doc)
    return text.replace('"\\u0000RAW\\u0000"', raw, 1)


@st.composite
def byte_edit(draw: st.DrawFn, text: str) -> bytes:
    data = bytearray(text.encode())
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, max(len(data) - 1, 0)))
        op = draw(st.sampled_from(("flip", "insert", "delete", "truncate")))
        byte = draw(st.integers(0, 255))
        if op == "flip" and data:
            data[at] ^= byte or 1
        elif op == "insert":
            data[at:at] = bytes([byte])
        elif op == "delete":
            del data[at : at + draw(st.integers(1, 64))]
        else:
            del data[at:]
    return bytes(data)


@st.composite
def mutated_trace(draw: st.DrawFn) -> tuple[str, bytes]:
    """(file name, bytes) of one mutated seed trace."""
    seed = draw(st.sampled_from(SEED_TRACES))
    if draw(st.booleans()):
        data = draw(json_edit(seed_doc(seed))).encode("utf-8", "surrogatepass")
    else:
        data = draw(byte_edit(seed_text(seed)))
    if draw(st.integers(0, 3)) == 0:
        return "rank-0.json.gz", gzip.compress(data, 1)
    return "rank-0.json", data


@st.composite
def mutated_capture(draw: st.DrawFn, root: Path) -> Path:
    """A copy of the seed capture under `root` with its manifest, a rank's collectives or a
    rank's trace mutated."""
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(SEED_CAPTURE, root)
    target = draw(
        st.sampled_from(
            (
                "manifest.json",
                "manifest.json",
                "rank-1/collectives.jsonl",
                "rank-2/rank.json",
                "trace",
            )
        )
    )
    if target == "trace":
        name, data = draw(mutated_trace())
        path = root / "rank-1" / "window-0.pt.trace.json.gz"
        path.write_bytes(data if name.endswith(".gz") else gzip.compress(data, 1))
        return root
    path = root / target
    if target.endswith(".jsonl"):
        lines = path.read_text().splitlines()
        n = draw(st.integers(0, len(lines) - 1))
        lines[n] = draw(json_edit(json.loads(lines[n])))
        path.write_text("\n".join(lines) + "\n", encoding="utf-8", errors="surrogatepass")
    else:
        if target == "rank-2/rank.json":
            (root / "manifest.json").unlink()  # rebuilt from the rank parts
            doc = json.loads((SEED_CAPTURE / "manifest.json").read_text())["ranks"][2]
            for r, entry in enumerate(
                json.loads((SEED_CAPTURE / "manifest.json").read_text())["ranks"]
            ):
                (root / f"rank-{r}" / "rank.json").write_text(json.dumps(entry))
        else:
            doc = json.loads(path.read_text())
        if draw(st.booleans()):
            path.write_bytes(draw(json_edit(doc)).encode("utf-8", "surrogatepass"))
        else:
            path.write_bytes(draw(byte_edit(json.dumps(doc))))
    return root


def fingerprint(db: Path) -> tuple[Any, ...]:
    """Rows of every table, cheaply (counts, run names, a hash of the events), after checking
    that what every user runs next still works: the run list, and times over every run."""
    from tracelab.store import list_runs

    with open_store(db) as con:
        list_runs(con)
        con.execute(
            "SELECT run_id, max(ts_ns + dur_ns) - min(ts_ns), sum(dur_ns) FROM events "
            "GROUP BY run_id"
        ).fetchall()
        counts = tuple(
            con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in ("runs", "ranks", "events", "steps", "lanes", "collectives", "memory")
        )
        names = tuple(r[0] for r in con.execute("SELECT name FROM runs ORDER BY name").fetchall())
        events = con.execute(
            "SELECT sum(hash(run_id, rank, idx, name, ts_ns, dur_ns, args)) FROM events"
        ).fetchone()[0]
    return counts, names, events


class Store:
    """The fuzzer's store: one good run, then every accepted mutation as a run of its own."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.before = fingerprint(db)
        self.accepted = 0

    def check_ingest(self, path: Path, rank_map: bool) -> str | None:
        """Ingest `path` as a new run; what went wrong, or None. A refused ingest must leave
        the store as it was; after an accepted one, the run list and SQL over every run must
        still work (fingerprint), and the run must delete cleanly now and then."""
        name = f"fz{self.accepted}"
        extra = ["--rank", f"{path.name}=0"] if rank_map and path.is_file() else []
        res = cli("ingest", str(path), "--db", str(self.db), "--run", name, *extra)
        if res.code not in CLEAN_EXITS or "Traceback" in res.err:
            return f"ingest exit {res.code}: {res.err.strip()[:500]}"
        if res.code != 0:
            return (
                None
                if fingerprint(self.db) == self.before
                else (f"refused ingest changed the store ({res.err.strip()[:300]})")
            )
        try:
            after = fingerprint(self.db)
        except Exception as exc:  # noqa: BLE001
            return f"after an accepted ingest the store fails: {type(exc).__name__}: {exc}"
        self.accepted += 1
        if self.accepted % 25 == 1:
            deleted = cli("delete", name, "--db", str(self.db))
            if deleted.code != 0 or fingerprint(self.db) != self.before:
                return f"delete of an accepted run failed or left rows: {deleted.err[:300]}"
        else:
            self.before = after
        return None
