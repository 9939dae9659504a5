"""The Ray engine of an ingest: each file's conversion runs as a Ray task on the cluster.

`tracelab ingest --engine ray [--address ADDR]` sends one task per trace file. A task reads its
trace from a path every node sees (a shared filesystem) and writes the columnar form beside it
(`<trace>.tracelab/`, the layout the collector's `convert=True` writes on each rank, see
tracelab.ingest.converted.converted_dir), so only the small per-file summary (TraceInfo, a few
hundred bytes) travels back to the driver; the driver then loads the Parquet files and moves the
run into the store in one short transaction, as with the local pool. A file converted before from the same
bytes is registered, not parsed again: its task checks the folder's hash on the node that reads
it (tracelab.ingest.convert.converted_beside); the driver reads no trace.

The derived layer's per-rank work (the lost-time parts, which grow with events) runs as Ray
tasks too, one per batch of ranks (batch_runner, tracelab.derived.part_batches): a task reads
its ranks' events files from the folder of the ingest's staged store, beside the store (which
must also be on the shared filesystem), and the small tables' rows of its ranks, which travel
with it, writes its time_parts file into that folder and sends back its step_parts and
comm_attribution rows, which the driver inserts in the staged store's transaction.

Ray is an optional extra (`pip install "tracelab[ray]"`); the local process pool stays the
default. Without `--address`, a local Ray instance is started for the ingest (and stopped after
it); with one, the ingest joins that cluster (`ray start --head` on one node, `ray start
--address` on the others) and leaves it running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from tracelab.derived.part_batches import BatchJob, BatchResult, Runner
from tracelab.errors import InputError, InternalError, TracelabError, UsageError
from tracelab.ingest.convert import converted_beside
from tracelab.ingest.converted import TraceInfo, converted_dir
from tracelab.interrupts import signals_held

#: Whether this process started a Ray driver (connected): Ray's core leaves threads running
#: past ray.shutdown(), and the `tracelab` command then ends without the interpreter's
#: teardown (tracelab.cli.run).
started = False
#: How often Ray retries a task whose worker died (a crash, the out-of-memory killer); then the
#: file is reported by name, as with the local pool.
TASK_RETRIES = 1


def import_ray() -> Any:
    # Ray's C++ core installs a failure-signal handler in the driver that takes SIGTERM too: a
    # SIGTERM once connected printed a native stack and aborted (exit 134), where the CLI
    # unwinds and exits 143. Ray reads the setting when imported: set for the import only, so
    # the processes a local instance starts keep their crash reports; a user's own wins.
    key = "RAY_DISABLE_FAILURE_SIGNAL_HANDLER"
    own = key in os.environ
    os.environ.setdefault(key, "1")
    try:
        import ray
    except ImportError as exc:
        raise UsageError(
            "--engine ray needs Ray: pip install 'tracelab[ray]' (on every node of the cluster)."
        ) from exc
    finally:
        if not own:
            os.environ.pop(key, None)
    return ray


@contextmanager
def connected(address: str | None, workers: int | None) -> Iterator[Any]:
    """Ray, connected to the cluster at `address`, or to a local instance started for this
    ingest with `workers` CPUs (all of this machine's by default)."""
    ray = import_ray()
    if ray.is_initialized():  # a caller's own session (a notebook, a test): use it as it is
        yield ray
        return
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "configure_logging": False,
    }
    if address:
        _reachable(address)
        kwargs["address"] = address
    else:
        # A local instance of this ingest's own, even where RAY_ADDRESS or a `ray start` on
        # this node names a cluster (ray.init would join it, and refuse num_cpus).
        kwargs["address"] = "local"
        kwargs["num_cpus"] = workers or os.cpu_count() or 1
    # ray.init installs its own SIGTERM and SIGINT handlers (a SIGTERM then aborted the process
    # with a stack dump, leaving the staging folder and the WAL): the CLI's own are restored,
    # so a terminated ingest unwinds (exit 143) as on the local engine.
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    before = _descendants(os.getpid())
    global started
    started = True
    try:
        try:
            ray.init(**kwargs)
        finally:
            if threading.current_thread() is threading.main_thread():
                for sig, handler in handlers.items():
                    if handler is not None:
                        signal.signal(sig, handler)
    except BaseException as exc:
        # A SIGTERM or a failure halfway through the start: what it started is stopped (a
        # local instance's processes outlived the ingest by a minute, ray::DashboardAgent and
        # ray::RuntimeEnvAgent orphaned), and Ray's SIGTERM handler's exit (code 15) becomes
        # the CLI's own unwinding: the signal is sent again, to the handlers just restored.
        _stop_what_init_started(ray, before if not address else None)
        if isinstance(exc, SystemExit) and exc.code == signal.SIGTERM:
            os.kill(os.getpid(), signal.SIGTERM)
        if isinstance(exc, (ConnectionError, ValueError, RuntimeError)):
            where = f"the Ray cluster at {address}" if address else "a local Ray instance"
            raise UsageError(
                f"could not connect to {where}: {exc}. Start one with `ray start --head`, or "
                "leave out --address to start a local one."
            ) from exc
        raise
    try:
        yield ray
    finally:
        ray.shutdown()


def _descendants(pid: int) -> set[int]:
    """The live processes below `pid` (Linux: /proc; elsewhere none are known)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        try:
            tasks = list(Path(f"/proc/{parent}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                if child not in found and _alive(child):
                    found.add(child)
                    todo.append(child)
    return found


def _alive(pid: int) -> bool:
    """Whether `pid` runs (not a zombie waiting for its parent)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def _stop_what_init_started(ray: Any, before: set[int] | None) -> None:
    """After ray.init failed or was stopped: Ray's own shutdown, then, for a local instance
    (`before`: this process's descendants before the start), every Ray process the start left
    below this one, killed (the whole tree is listed before any dies: an agent whose raylet
    dies first is handed to init, out of reach). A second signal meanwhile (the main thread
    takes it while other threads run, whatever its mask) is raised once this is done."""
    later: list[BaseException] = []

    def step(fn: Callable[[], object]) -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001, S110 (best effort: what is left is killed below)
            pass
        except BaseException as exc:  # noqa: BLE001 (a signal's raise: after the cleanup)
            later.append(exc)

    gone = False

    def kill_what_is_left() -> None:
        nonlocal gone
        left = [pid for pid in _descendants(os.getpid()) - (before or set()) if _is_ray(pid)]
        gone = not left
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if left:
            time.sleep(0.05)

    with signals_held():
        step(ray.shutdown)
        for _ in range(_STOP_TRIES if before is not None else 0):
            step(kill_what_is_left)  # (a round a signal cut short is done again)
            if gone:
                break
    if later:
        raise later[0]


def _is_ray(pid: int) -> bool:
    """Whether `pid` is one of Ray's processes (gcs_server, raylet, ray::*, Ray's Python
    agents): a caller's own subprocesses started meanwhile are not killed."""
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"ray" in cmd


#: How often _stop_what_init_started lists and kills what is left.
_STOP_TRIES = 20


def _reachable(address: str, timeout_s: float = 5.0) -> None:
    """Refuse a cluster address nothing answers at, at once: ray.init retries an unreachable
    GCS for minutes before it gives up."""
    if address == "auto" or address.startswith("ray://"):
        return
    host, _, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")  # [::1]:6379, as Ray writes IPv6
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"could not connect to the Ray cluster at {address}: {exc}. Start one with "
            "`ray start --head` and pass the address it prints, or leave out --address to "
            "start a local one."
        ) from None


def convert_on_ray(
    paths: list[Path],
    *,
    address: str | None,
    workers: int | None,
    progress: Callable[[int, int], None] | None,
) -> tuple[dict[int, tuple[TraceInfo, Path]], dict[int, TracelabError]]:
    """Convert `paths` as Ray tasks; per-index results (the summary and the folder of its
    Parquet files) and per-file errors, as tracelab.ingest.pool.convert_all returns them."""
    done: dict[int, tuple[TraceInfo, Path]] = {}
    errors: dict[int, TracelabError] = {}
    if not paths:
        return done, errors
    with connected(address, workers) as ray:
        task = ray.remote(max_retries=TASK_RETRIES, num_cpus=1)(converted_beside)
        # Absolute: a worker on another node runs in the folder its `ray start` ran in.
        absolute = [Path(os.path.abspath(p)) for p in paths]
        refs = {task.remote(str(p)): i for i, p in enumerate(absolute)}
        pending = list(refs)
        n = 0
        while pending:
            finished, pending = ray.wait(pending, num_returns=min(len(pending), 64), timeout=1.0)
            for ref in finished:
                i = refs.pop(ref)
                try:
                    info = _registered(ray.get(ref), absolute[i])
                    # (named as given, as the local pool names it: the task's path is absolute)
                    done[i] = (replace(info, file=str(paths[i])), converted_dir(absolute[i]))
                except Exception as exc:  # noqa: BLE001 (per-file failure policy)
                    errors[i] = _task_error(exc, paths[i])
                n += 1
                if progress:
                    progress(n, len(paths))
    return done, errors


def _registered(info: TraceInfo, path: Path) -> TraceInfo:
    """A task's result, once the folder beside its trace is checked to be the one it wrote
    (another conversion of the same trace may have replaced it since, from changed bytes)."""
    try:  # its trace.json, not load_converted: that hashes the trace again, on the driver
        found = TraceInfo.from_json((converted_dir(path) / "trace.json").read_text())
    except (OSError, ValueError, TypeError):
        found = None
    if found is None or found.sha256 != info.sha256 or found.event_count != info.event_count:
        raise InputError(
            "the converted folder beside this trace changed while it was ingested (another "
            "conversion of it ran at the same time, or the trace was rewritten). Ingest again "
            "once the trace is final.",
            str(path),
        )
    return info


def _task_error(exc: BaseException, path: Path) -> TracelabError:
    """A task's failure as the local pool reports it: the input error the converter raised
    (Ray wraps it in a RayTaskError whose cause is the original), or an InternalError naming
    the file (a crash, a worker that died even when retried)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, TracelabError):
        return cause
    if isinstance(exc, TracelabError):
        return exc
    what = type(cause or exc).__name__
    retried = (
        "" if cause is not None else f"; a worker that died was retried {TASK_RETRIES} time(s)"
    )
    err = InternalError(f"its Ray task failed ({what}: {cause or exc}){retried}", str(path))
    err.__cause__ = exc
    return err


#: How many of the traces each node is asked about (check_shared): evenly spaced, so a folder
#: of 10,000 traces costs each node a handful of lookups, not 10,000 on a network filesystem;
#: and one trace of each folder, up to SHARED_FOLDERS folders (a folder on another mount).
SHARED_SAMPLE = 8
SHARED_FOLDERS = 32
#: How long check_shared waits for the nodes' answers.
SHARED_WAIT_S = 60.0


def _unusable(traces: list[str], staging: str) -> tuple[str, list[str]]:
    """This node's name and what it cannot do with the paths (a task of check_shared): each
    trace it cannot see or read, and the staging folder if it cannot see or write it."""
    problems = []
    for path in traces:
        if not os.path.exists(path):
            problems.append(f"cannot see {path}")
        elif not os.access(path, os.R_OK):
            problems.append(f"cannot read {path}")
    if not os.path.isdir(staging):
        problems.append(f"cannot see the store's staging folder {staging}")
    elif not os.access(staging, os.W_OK | os.X_OK):
        problems.append(f"cannot write the store's staging folder {staging}")
    return socket.gethostname(), problems


def _sample(traces: list[Path]) -> list[str]:
    """The traces check_shared asks about (SHARED_SAMPLE, SHARED_FOLDERS), absolute."""
    step = max(1, len(traces) // SHARED_SAMPLE)
    first_of_folder: dict[Path, Path] = {}
    for t in traces:
        if len(first_of_folder) >= SHARED_FOLDERS:
            break
        first_of_folder.setdefault(t.parent, t)
    picked = [*traces[::step][:SHARED_SAMPLE], *traces[-1:], *first_of_folder.values()]
    return list(dict.fromkeys(os.path.abspath(t) for t in picked))


def check_shared(ray: Any, address: str | None, traces: list[Path], staging: Path) -> list[str]:
    """Refuse, before any work, a cluster whose nodes do not all see the traces and the
    staging folder beside the store: a conversion task reads its trace (and writes beside it)
    where it runs, and a batch reads and writes the staging folder, so a node that lacks them
    failed its files one by one ("cannot read the file") or left the run without its
    lost-time parts (derived_errors), after the whole conversion. One task per live node with
    CPUs (the tasks' nodes: num_cpus=0, pinned to the node) checks a sample of the traces
    (_sample) and the staging folder, at the paths this process uses. Returns notes on the
    nodes that could not be asked (gone meanwhile, or silent for SHARED_WAIT_S)."""
    from ray.exceptions import NodeDiedError, RayError, TaskUnschedulableError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    sample = _sample(traces)
    folder = os.path.abspath(staging)
    nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU")]
    task = ray.remote(num_cpus=0, max_retries=0)(_unusable)
    refs = {
        task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(sample, folder): n
        for n in nodes
    }
    ready, silent = ray.wait(list(refs), num_returns=len(refs), timeout=SHARED_WAIT_S)
    where = f"the Ray cluster at {address}" if address else "the Ray cluster"
    notes = []
    for ref in ready:
        node = _node_name(refs[ref])
        try:
            host, problems = ray.get(ref)
        except (TaskUnschedulableError, NodeDiedError):
            notes.append(f"node {node} left {where} during the shared-filesystem check")
            continue
        except RayError as exc:
            raise UsageError(
                f"could not run tracelab's check on node {node} of {where} "
                f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}). "
                "Every node needs tracelab and Ray installed as on this machine: "
                "pip install 'tracelab[ray]' on each."
            ) from None
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise UsageError(
                f"node {host} ({node}) of {where} {problems[0]}{more}. --engine ray reads each "
                "trace and writes beside it, and beside the store, on the node that runs its "
                "task, so the traces and the store (--db) must be on a filesystem that every "
                "node mounts at the same path (NFS, Lustre, a cloud filesystem) and that the "
                "Ray workers' user can read and write. Put both there, or ingest without "
                "--engine ray."
            )
    for ref in silent:
        ray.cancel(ref, force=True)
        notes.append(
            f"node {_node_name(refs[ref])} of {where} did not answer the shared-filesystem check in "
            f"{SHARED_WAIT_S:.0f} s: it was not checked"
        )
    return notes


def _node_name(node: dict[str, Any]) -> str:
    """A node of ray.nodes() as a message names it: its address, else its id."""
    return str(node.get("NodeManagerAddress") or node.get("NodeID", "?"))


def batch_runner(ray: Any) -> Runner:
    """Derive each batch of ranks as a Ray task on the connected cluster (its jobs submitted
    at once, the results taken in order)."""

    def map_batches(
        fn: Callable[[BatchJob], BatchResult], jobs: Iterable[BatchJob]
    ) -> Iterator[BatchResult]:
        task = ray.remote(max_retries=TASK_RETRIES, num_cpus=1)(fn)
        refs = [task.remote(job) for job in jobs]
        for ref in refs:
            yield ray.get(ref)

    cpus = int(ray.cluster_resources().get("CPU", 1))
    return Runner(map=map_batches, workers=max(1, cpus), remote=True)
