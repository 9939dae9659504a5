"""PyTorch's Flight Recorder as a source of collective records.

The Flight Recorder (FR) records every collective of every process group, including those
issued from C++ that no Python hook sees: the DDP reducer's gradient all-reduces and functional
collectives. It must be armed before the process group starts (`TORCH_FR_BUFFER_SIZE`), which
is what `arm_flight_recorder()` does; call it before `init_process_group`.

At a window's end the collector dumps FR and keeps the window's entries:
- an entry created while a hooked Python call was issuing it on the same group is that call's
  record: the record takes the entry's `collective_seq_id` as its `seq`, so that both sources
  share one numbering and nothing is written twice;
- the other entries become `source: "flight_recorder"` records. On NCCL, FR's own start/end are
  only as fine as its watchdog's polling, so they stay null; on gloo FR has none at all, and
  `fill_gloo_times` takes them from the trace's `gloo:*` events when the pairing is unambiguous.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from tracelab.collectors.records import (
    P2P_OPS,
    CollectiveRecord,
    op_from_profiling_name,
)
from tracelab.hang.dumps import DUMP_DIR  # the capture's dump folder, defined by the reader

log = logging.getLogger("tracelab.collectors")

BUFFER_ENV = "TORCH_FR_BUFFER_SIZE"
_LEGACY_BUFFER_ENV = "TORCH_NCCL_TRACE_BUFFER_SIZE"
DEFAULT_BUFFER_SIZE = 20000
#: Two `gloo:*` events starting closer than this cannot be told apart reliably.
MIN_GAP_NS = 50_000

_DTYPES = {  # Flight Recorder's scalar type names -> (torch name, bytes per element)
    "Float": ("float32", 4),
    "Double": ("float64", 8),
    "Half": ("float16", 2),
    "BFloat16": ("bfloat16", 2),
    "Long": ("int64", 8),
    "Int": ("int32", 4),
    "Short": ("int16", 2),
    "Char": ("int8", 1),
    "Byte": ("uint8", 1),
    "Bool": ("bool", 1),
    "ComplexFloat": ("complex64", 8),
    "ComplexDouble": ("complex128", 16),
    "Float8_e4m3fn": ("float8_e4m3fn", 1),
    "Float8_e5m2": ("float8_e5m2", 1),
}


def arm_flight_recorder(
    buffer_size: int = DEFAULT_BUFFER_SIZE, *, nccl_timing: bool = True
) -> bool:
    """Arm PyTorch's Flight Recorder for this process. Call it before `init_process_group`.

    Sets `TORCH_FR_BUFFER_SIZE` (unless already set) and, with `nccl_timing`,
    `TORCH_NCCL_ENABLE_TIMING=1` so that NCCL entries carry durations. Returns False, and
    changes nothing, when a process group already exists: the recorder reads its setting
    when the first group starts.
    """
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        log.warning(
            "tracelab: arm_flight_recorder() was called after init_process_group; the Flight "
            "Recorder stays off. Call it before init_process_group, or export %s=%d.",
            BUFFER_ENV,
            buffer_size,
        )
        return False
    os.environ.setdefault(BUFFER_ENV, str(int(buffer_size)))
    if nccl_timing:
        os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")
    return True


def is_armed() -> bool:
    for name in (BUFFER_ENV, _LEGACY_BUFFER_ENV):
        try:
            if int(os.environ.get(name, "0")) > 0:
                return True
        except ValueError:
            continue
    return False


def dump() -> dict[str, Any] | None:
    """The Flight Recorder's content as a dict, or None when this torch has no recorder."""
    c10d = torch._C._distributed_c10d
    for name in ("_dump_fr_trace_json", "_dump_nccl_trace_json"):
        fn = getattr(c10d, name, None)
        if fn is None:
            continue
        try:
            data = json.loads(fn(True, False))
        except Exception:
            continue
        if isinstance(data, dict):
            return data
    fn = getattr(c10d, "_dump_nccl_trace", None)  # torch <= 2.4: pickle
    if fn is not None:
        import pickle

        try:
            data = pickle.loads(fn())
            return data if isinstance(data, dict) else None
        except Exception:
            return None
    return None


def window_entries(
    data: dict[str, Any], start_ns: int, end_ns: int, exclude_pgs: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """Collective (non-p2p) entries created in [start_ns, end_ns], oldest first."""
    excluded = set(exclude_pgs)
    out = []
    for e in data.get("entries") or []:
        created = int(e.get("time_created_ns") or 0)
        pg = e.get("process_group") or ["", ""]
        if not start_ns <= created <= end_ns or str(pg[0]) in excluded:
            continue
        if e.get("is_p2p") or op_from_profiling_name(str(e.get("profiling_name", ""))) in P2P_OPS:
            continue  # p2p is always issued from Python, where the hooks time it
        out.append(e)
    out.sort(
        key=lambda e: (str((e.get("process_group") or [""])[0]), e.get("collective_seq_id", 0))
    )
    return out


def reconcile(
    records: list[CollectiveRecord], entries: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[str]]:
    """Give hooked records FR's sequence numbers; return the entries no hook saw, and the
    groups where the pairing failed (their records' `seq` is cleared rather than mixing two
    numberings across ranks)."""
    by_pg: dict[str, list[dict[str, Any]]] = {}
    for e in entries:
        by_pg.setdefault(str((e.get("process_group") or [""])[0]), []).append(e)
    matched: set[int] = set()
    failed: list[str] = []
    colls = sorted((r for r in records if r.op not in P2P_OPS), key=lambda r: r.enqueue_ns or 0)
    recs_by_pg: dict[str, list[CollectiveRecord]] = {}
    for r in colls:
        recs_by_pg.setdefault(r.pg_name or "", []).append(r)
    for pg, recs in recs_by_pg.items():
        cands = sorted(by_pg.get(pg, []), key=lambda e: int(e.get("time_created_ns") or 0))
        i = 0
        pairs: list[tuple[CollectiveRecord, dict[str, Any]]] = []
        for r in recs:
            lo, hi = r.enqueue_ns or 0, r.issued_ns or r.enqueue_ns or 0
            while i < len(cands) and int(cands[i].get("time_created_ns") or 0) < lo:
                i += 1
            if i < len(cands) and int(cands[i].get("time_created_ns") or 0) <= hi:
                pairs.append((r, cands[i]))
                i += 1
            else:
                break
        if len(pairs) != len(recs):
            failed.append(pg)
            for r in recs:
                r.seq = None
            continue
        for r, e in pairs:
            r.seq = int(e["collective_seq_id"])
            matched.add(id(e))
    return [e for e in entries if id(e) not in matched], failed


def entry_record(
    e: dict[str, Any],
    *,
    groups: dict[str, list[int]],
    step_of: Callable[[int], int | None],
    window: int,
) -> CollectiveRecord:
    """A `source: "flight_recorder"` record from one FR entry."""
    pg = e.get("process_group") or ["", ""]
    ranks = groups.get(str(pg[0]))
    created = int(e.get("time_created_ns") or 0)
    in_bytes, dtype = _sized(e.get("input_sizes"), e.get("input_dtypes"))
    out_bytes, out_dtype = _sized(e.get("output_sizes"), e.get("output_dtypes"))
    return CollectiveRecord(
        op=op_from_profiling_name(str(e.get("profiling_name", ""))),
        source="flight_recorder",
        pg_name=str(pg[0]),
        pg_desc=str(pg[1]) if len(pg) > 1 else None,
        pg_ranks=ranks,
        group_size=len(ranks) if ranks else None,
        seq=int(e["collective_seq_id"]),
        in_bytes=in_bytes,
        out_bytes=out_bytes,
        dtype=dtype or out_dtype,
        enqueue_ns=created,
        step=step_of(created),
        window=window,
    )


def window_records(
    records: list[CollectiveRecord],
    *,
    start_ns: int,
    end_ns: int,
    window: int,
    exclude_pgs: list[str],
    groups: dict[str, list[int]],
    step_of: Callable[[int], int | None],
    gloo_events: list[tuple[str, int, int]],
    rank: int,
) -> list[CollectiveRecord]:
    """The window's Flight Recorder rows: dump, keep the window, pair with the hooked
    `records` (which take FR's seq), time what gloo's trace events allow."""
    data = dump()
    if data is None:
        return []
    entries = window_entries(data, start_ns, end_ns, exclude_pgs)
    leftover, failed = reconcile(records, entries)
    if failed:
        log.warning(
            "tracelab: rank %d window %d: hooked collectives on group(s) %s could not "
            "be paired with Flight Recorder entries; their seq is left null.",
            rank,
            window,
            failed,
        )
    pairs = [(entry_record(e, groups=groups, step_of=step_of, window=window), e) for e in leftover]
    if gloo_events:
        fill_gloo_times(pairs, entries, gloo_events)
    return [rec for rec, _ in pairs]


def fill_gloo_times(
    records: list[tuple[CollectiveRecord, dict[str, Any]]],
    window_entries_: list[dict[str, Any]],
    events: list[tuple[str, int, int]],
) -> int:
    """Give FR-only gloo records the start/end of their `gloo:<op>` trace event.

    gloo's worker threads take work in enqueue order, so the k-th `gloo:all_reduce` event of a
    window is the k-th `gloo:all_reduce` entry, provided that every such entry is on one group,
    the counts agree, each event starts after its entry was created, and no two events start
    within MIN_GAP_NS of each other (then two threads could have swapped them). Any doubt
    leaves the times null. Returns how many records were filled.
    """
    filled = 0
    names = {str(e.get("profiling_name", "")) for e in window_entries_}
    for name in sorted(n for n in names if n.startswith("gloo:")):
        ents = [e for e in window_entries_ if str(e.get("profiling_name", "")) == name]
        evs = sorted((ev for ev in events if ev[0] == name), key=lambda ev: ev[1])
        if len({str((e.get("process_group") or [""])[0]) for e in ents}) != 1 or len(evs) != len(
            ents
        ):
            continue
        ents.sort(key=lambda e: int(e.get("collective_seq_id", 0)))
        ok = all(ev[1] >= int(e.get("time_created_ns") or 0) for e, ev in zip(ents, evs))
        ok = ok and all(b[1] - a[1] >= MIN_GAP_NS for a, b in zip(evs, evs[1:]))
        if not ok:
            continue
        timing = {id(e): ev for e, ev in zip(ents, evs)}
        for rec, e in records:
            ev = timing.get(id(e))
            if ev is not None:
                rec.start_ns, rec.end_ns = ev[1], ev[1] + ev[2]
                filled += 1
    return filled


def _sized(sizes: Any, dtypes: Any) -> tuple[int | None, str | None]:
    if not isinstance(sizes, list) or not isinstance(dtypes, list):
        return None, None
    total = 0
    first: str | None = None
    for shape, dt in zip(sizes, dtypes):
        name, width = _DTYPES.get(str(dt), (None, None))
        if width is None:
            return None, first
        first = first or name
        total += math.prod(int(d) for d in shape) * width
    return total, first


def write_dumps(root: Path, rank: int) -> list[Path]:
    """Write this rank's recorder into `root/flight-recorder/`: the pickle form (with Python
    stacks) and the JSON form, named as `tracelab hang` and PyTorch's fr_trace read them
    (`rank_<N>.pkl`, `rank_<N>.json`). Returns what was written; never raises."""
    c10d = torch._C._distributed_c10d
    folder = root / DUMP_DIR
    written: list[Path] = []
    forms = (
        ("_dump_fr_trace", (True, True, False), "pkl"),
        ("_dump_nccl_trace", (True, True, False), "pkl"),
        ("_dump_fr_trace_json", (True, False), "json"),
        ("_dump_nccl_trace_json", (True, False), "json"),
    )
    done: set[str] = set()
    for name, args, ext in forms:
        fn = getattr(c10d, name, None)
        if fn is None or ext in done:
            continue
        try:
            data = fn(*args)
            folder.mkdir(parents=True, exist_ok=True)
            path = folder / f"rank_{rank}.{ext}"
            path.write_bytes(data if isinstance(data, bytes) else str(data).encode())
        except Exception as exc:  # the job comes first: a failed dump is logged, not raised
            log.warning("tracelab: could not write the Flight Recorder dump (%s): %s", name, exc)
            continue
        written.append(path)
        done.add(ext)
    return written


def dump_on_signal(root: Path, rank: int, signum: int | None = None) -> bool:
    """Write the dumps whenever the process gets `signum` (SIGUSR1 by default): `kill -USR1`
    every rank of a job that seems hung, then run `tracelab hang CAPTURE/flight-recorder`.
    The job carries on. Returns False where no handler can be installed (not the main
    thread, or no such signal)."""
    import signal
    import threading

    sig = signum if signum is not None else getattr(signal, "SIGUSR1", None)
    if sig is None or threading.current_thread() is not threading.main_thread():
        return False
    try:
        signal.signal(sig, lambda _s, _f: write_dumps(root, rank))
    except (ValueError, OSError):
        return False
    return True
