"""`tracelab ingest --engine ray` on a real local Ray cluster (started here on 127.0.0.1, no
mock): the same store as the local process pool, table by table and row by row, and the same
per-file failure policy."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tracelab.ingest import ingest
from tracelab.ingest.converted import converted_dir
from tracelab.store import RUN_TABLES, open_store

from .hostile import cli, unwritable
from .kineto import run_set

pytestmark = pytest.mark.ray
RAY = Path(sys.executable).parent / "ray"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A Ray head of our own on 127.0.0.1 with 2 CPUs (two workers). `ray start --block` keeps
    the cluster's processes in one new session, which is ended at teardown: never `ray stop`,
    which stops every Ray cluster of the machine (another worker's, a developer's)."""
    port = _free_port()
    # Ray's socket paths must stay short: a temp dir of its own right under /tmp.
    temp = tempfile.mkdtemp(prefix="tlray", dir="/tmp")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    start = [
        str(RAY), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
        "--num-cpus=2", "--include-dashboard=false", "--disable-usage-stats",
        "--object-store-memory=150000000", f"--temp-dir={temp}",
    ]  # fmt: skip
    head = subprocess.Popen(
        start, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if head.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the Ray head did not start") from None
                time.sleep(0.5)
        time.sleep(2)  # the raylet registers after the GCS listens
        yield f"127.0.0.1:{port}"
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(head.pid, sig)
            try:
                head.wait(timeout=15)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)  # what the head started and left behind
        shutil.rmtree(temp, ignore_errors=True)


def _tracelab(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI in a child process: Ray's driver (threads, signal and exit handlers) never
    lives in the test process."""
    return subprocess.run(
        [sys.executable, "-m", "tracelab.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        env=env,
    )


def _ray_ingest(traces: Path, db: Path, address: str, *more: str) -> None:
    res = _tracelab("ingest", str(traces), "--db", str(db), "--run", "r",
                    "--engine", "ray", "--address", address, *more)  # fmt: skip
    assert res.returncode == 0, res.stderr


def _rows(db: Path) -> dict[str, list[str]]:
    """Every row of every per-run table, base and derived, but when the run was made."""
    out = {}
    with open_store(db) as con:
        for table in RUN_TABLES:
            cols = [c for (c,) in con.execute(
                "SELECT column_name FROM duckdb_columns() WHERE table_name = $t "
                "AND column_name NOT IN ('created_at') ORDER BY column_index", {"t": table}
            ).fetchall()]  # fmt: skip
            rows = con.execute(f"SELECT {', '.join(cols)} FROM {table}").fetchall()
            out[table] = sorted(map(repr, rows))
    return out


def test_same_tables_as_the_local_pool(tmp_path: Path, cluster: str) -> None:
    traces = run_set(tmp_path / "traces", ranks=6)
    local, on_ray = tmp_path / "local.duckdb", tmp_path / "ray.duckdb"
    ingest([traces], db=local, run="r", workers=2, progress=False)
    _ray_ingest(traces, on_ray, cluster)
    # Each trace's Parquet files were written beside it, by the tasks.
    assert all(converted_dir(traces / f"rank-{r}.json").is_dir() for r in range(6))
    want, got = _rows(local), _rows(on_ray)
    assert set(got) == set(want)
    for table in want:
        assert got[table] == want[table], table
    assert sum(len(v) for v in got.values()) > 50
    # The parts were derived as Ray tasks, a batch of ranks per each of the cluster's 2 CPUs
    # (tracelab.derived.part_batches), and came out as the local ingest's single batch did (a
    # run this small is not shared among local threads: part_batches.LEAST_SHARED).
    assert len(_parts_files(local)) == 1
    assert len(_parts_files(on_ray)) == 2


def _parts_files(db: Path) -> list[str]:
    with open_store(db) as con:
        return [p for (p,) in con.execute(
            "SELECT path FROM parquet_files WHERE kind = 'time_parts'"
        ).fetchall()]  # fmt: skip


def test_a_bad_file_is_named_and_skipped_as_with_the_local_pool(
    tmp_path: Path, cluster: str
) -> None:
    traces = run_set(tmp_path / "traces", ranks=3)
    (traces / "rank-1.json").write_text('{"traceEvents": [')  # truncated
    db = tmp_path / "s.duckdb"
    res = _tracelab("ingest", str(traces), "--db", str(db), "--engine", "ray", "--address", cluster)
    assert res.returncode == 3 and "rank-1.json" in res.stderr, res.stderr
    assert not db.exists() or not _rows(db)["runs"]
    res = _tracelab(
        "ingest", str(traces), "--db", str(db), "--engine", "ray", "--address", cluster,
        "--skip-bad",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert "skipped" in res.stdout and "rank-1.json" in res.stdout
    with open_store(db) as con:
        assert con.execute("SELECT list(rank ORDER BY rank) FROM ranks").fetchall() == [([0, 2],)]


def test_a_trace_folder_the_workers_cannot_write_is_named(tmp_path: Path, cluster: str) -> None:
    """A Ray task converts beside its trace: a folder it cannot write was "internal error ...
    a bug" (exit 70, Ray's traceback). Now an input error naming the trace, and the way out."""
    traces = run_set(tmp_path / "traces", ranks=2)
    db = tmp_path / "s.duckdb"
    with unwritable(traces):
        res = _tracelab("ingest", str(traces), "--db", str(db), "--engine", "ray",
                        "--address", cluster)  # fmt: skip
    assert res.returncode == 3, res.stderr
    assert "cannot write the converted files beside this trace" in res.stderr, res.stderr
    assert "rank-0.json" in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not db.exists() or not _rows(db)["runs"]


#: The CLI, in a driver that fails on hashing a trace (tracelab.ingest.converted._sha256):
#: Ray's workers are the cluster's processes, which hash as usual.
_DRIVER_NEVER_HASHES = """
import sys
import tracelab.ingest.converted as converted
def _sha256(fh):
    raise AssertionError("the driver hashed a trace: " + fh.name)
converted._sha256 = _sha256
from tracelab.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_converted_trace_is_registered_not_sent_again(tmp_path: Path, cluster: str) -> None:
    """Files converted beside the traces (by an earlier Ray ingest, or on each rank by the
    collector) are registered by the next ingest; no task parses them again, and each folder
    is checked against its trace's bytes by a task, where the trace is read: the driver hashed
    every trace, one after another (at 1,000 ranks of 100 MB, 100 GB read by one process)."""
    traces = run_set(tmp_path / "traces", ranks=2)
    first = tmp_path / "a.duckdb"
    _ray_ingest(traces, first, cluster)
    stamps = {p: p.stat().st_mtime_ns for p in traces.rglob("*.parquet")}
    second = tmp_path / "b.duckdb"
    res = subprocess.run(
        [sys.executable, "-c", _DRIVER_NEVER_HASHES, "ingest", str(traces), "--db", str(second),
         "--run", "r", "--engine", "ray", "--address", cluster],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert stamps and {p: p.stat().st_mtime_ns for p in traces.rglob("*.parquet")} == stamps
    assert _rows(first) == _rows(second)
    # ... and a trace changed since is converted again, by its task.
    trace_file = traces / "rank-1.json"
    trace_file.write_text(trace_file.read_text().replace('"traceEvents"', '"traceEvents" ', 1))
    third = tmp_path / "c.duckdb"
    _ray_ingest(traces, third, cluster)
    changed = {p for p in traces.rglob("*.parquet") if stamps.get(p) != p.stat().st_mtime_ns}
    assert changed and all(p.parent.name == "rank-1.tracelab" for p in changed), changed


#: check_shared against the test cluster, in a driver of its own: argv 1 the address, 2 the
#: staging folder's parent, 3 "ghost" to list a node that does not exist beside the real one,
#: 4.. the traces; prints "seen by every node" and the notes, or the error.
_CHECK_SHARED = """
import sys
from pathlib import Path
from tracelab.errors import UsageError
from tracelab.ingest import workers
from tracelab.ingest.ray_engine import check_shared, connected
staging = workers.make_staging(sys.argv[2])
try:
    with connected(sys.argv[1], None) as ray:
        if sys.argv[3] == "ghost":
            real = ray.nodes
            ghost = {"Alive": True, "NodeID": "ab" * 28, "NodeManagerAddress": "10.9.9.9",
                     "Resources": {"CPU": 8.0}}
            ray.nodes = lambda: [*real(), ghost]
        notes = check_shared(ray, sys.argv[1], [Path(p) for p in sys.argv[4:]], staging)
    print("seen by every node", *notes, sep="|")
except UsageError as exc:
    print(exc)
finally:
    workers.remove_staging(staging)
"""

#: The CLI in a driver whose check also asks about a trace that exists nowhere (standing for
#: one a node's filesystem lacks): the check's wiring through the ingest, end to end.
_CLI_WITH_A_GONE_TRACE = """
import sys
from pathlib import Path
import tracelab.ingest.ray_engine as engine
sample = engine._sample
engine._sample = lambda traces: [*sample(traces), "/nowhere/rank-9.json"]
from tracelab.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_cluster_whose_nodes_cannot_see_the_traces_is_refused_first(
    tmp_path: Path, cluster: str
) -> None:
    """Each node of a joined cluster is asked, by a task pinned to it, whether it sees a sample
    of the traces and the staging folder at this machine's paths, before any work: a node
    without them failed its files one by one, or left the run without its lost-time parts,
    after the whole conversion. (One machine: every node sees every path, so a path that
    exists nowhere stands for one that a node's filesystem lacks.)"""
    traces = sorted(run_set(tmp_path / "traces", ranks=3).glob("*.json"))

    def check(*paths: Path, ghost: bool = False) -> str:
        res = subprocess.run(
            [sys.executable, "-c", _CHECK_SHARED, cluster, str(tmp_path),
             "ghost" if ghost else "-", *map(str, paths)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert res.returncode == 0, res.stderr
        return res.stdout.strip().splitlines()[-1]

    assert check(*traces) == "seen by every node"
    gone = tmp_path / "elsewhere" / "rank-9.json"
    said = check(*traces, gone)
    assert said.startswith("node ") and f"cannot see {gone}." in said, said
    assert "that every node mounts at the same path" in said and "--db" in said
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # staging removed
    # A node listed as alive that is gone when its task is placed (drained, died): noted, not
    # an internal error (TaskUnschedulableError reached the CLI as "a bug in tracelab").
    said = check(*traces, ghost=True)
    assert said.startswith("seen by every node|node 10.9.9.9 left the Ray cluster"), said
    # Through the CLI: refused with exit 2 before any trace is converted, nothing stored.
    db = tmp_path / "s.duckdb"
    res = subprocess.run(
        [sys.executable, "-c", _CLI_WITH_A_GONE_TRACE, "ingest", str(traces[0].parent),
         "--db", str(db), "--engine", "ray", "--address", cluster],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert res.returncode == 2, res.stderr
    assert "cannot see /nowhere/rank-9.json" in res.stderr and "Traceback" not in res.stderr
    assert not list(traces[0].parent.glob("*.tracelab"))
    assert not db.exists() or _rows(db)["runs"] == []


def test_address_without_the_ray_engine_is_a_usage_error(tmp_path: Path) -> None:
    res = cli("ingest", str(run_set(tmp_path / "t")), "--address", "127.0.0.1:1")
    assert res.code == 2 and "--engine ray" in res.err


def test_an_unreachable_cluster_is_a_clear_error(tmp_path: Path) -> None:
    traces = run_set(tmp_path / "t")
    port = _free_port()  # nothing listens there
    res = _tracelab(
        "ingest", str(traces), "--db", str(tmp_path / "s.duckdb"),
        "--engine", "ray", "--address", f"127.0.0.1:{port}",
    )  # fmt: skip
    assert res.returncode == 2 and "Ray cluster" in res.stderr, res.stderr
    assert not (tmp_path / "s.duckdb").exists()


def test_relative_trace_paths_reach_the_workers(tmp_path: Path, cluster: str) -> None:
    # The cluster's workers run in the folder its `ray start` ran in (this test's), not the
    # ingest's: the tasks get absolute paths.
    run_set(tmp_path / "traces", ranks=2)
    db = tmp_path / "s.duckdb"
    res = _tracelab(
        "ingest", "traces", "--db", str(db), "--engine", "ray", "--address", cluster,
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert converted_dir(tmp_path / "traces" / "rank-0.json").is_dir()
    with open_store(db) as con:
        assert con.execute("SELECT count(DISTINCT rank) FROM events").fetchall() == [(2,)]
        files = con.execute("SELECT list(files ORDER BY rank) FROM ranks").fetchall()[0][0]
    # ... and the store names the traces as the user did, as the local pool's does (the
    # tasks' absolute paths were stored).
    local = tmp_path / "local.duckdb"
    assert _tracelab("ingest", "traces", "--db", str(local), cwd=tmp_path).returncode == 0
    with open_store(local) as con:
        assert con.execute("SELECT list(files ORDER BY rank) FROM ranks").fetchall()[0][0] == files
    assert files == ['["traces/rank-0.json"]', '["traces/rank-1.json"]']


def test_without_address_the_ingest_starts_its_own_instance(tmp_path: Path, cluster: str) -> None:
    # RAY_ADDRESS (or a `ray start` on this node) names a cluster: without --address the
    # ingest still starts a local instance of its own (ray.init joined the cluster, and refused
    # the CPU count given for a local one).
    traces = run_set(tmp_path / "traces", ranks=2)
    # A home of its own: a local instance writes ~/.ray/auth_token, after which joining the
    # test cluster (started without a token) fails for every later test (docs/scale-out.md).
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "RAY_ADDRESS": cluster, "RAY_USAGE_STATS_ENABLED": "0", "HOME": str(home)}
    res = _tracelab(
        "ingest", str(traces), "--db", str(tmp_path / "s.duckdb"), "--engine", "ray",
        "--workers", "1", env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr


def _running_under(folder: str) -> list[str]:
    """The command lines of the live processes that name `folder` (a Ray instance's temp dir)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (proc / "stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            continue
        if folder in cmd and state != "Z":
            found.append(f"{proc.name}: {cmd[:120]}")
    return found


@pytest.mark.parametrize(
    ("after_s", "twice"), [(0.0, False), (0.8, False), (1.6, False), (0.0, True)]
)
def test_a_sigterm_while_the_local_instance_starts_leaves_nothing_running(
    tmp_path: Path, after_s: float, twice: bool
) -> None:
    """SIGTERM while the ingest's own Ray instance starts: exit 143 and "terminated", as on the
    local engine, and none of the instance's processes left running. Ray's handler made it
    exit 15, its C++ core's handler aborted it with a native stack (134), ray::DashboardAgent
    and ray::RuntimeEnvAgent outlived it by a minute, and the interpreter's teardown crashed
    in a thread Ray left running (139). At 0 s the signal lands inside ray.init by
    construction (the GCS is the instance's first process, and init waits for its raylet);
    `twice`: a second SIGTERM 50 ms later, while the start's processes are being stopped."""
    traces = run_set(tmp_path / "traces", ranks=2)
    home = tmp_path / "home"
    home.mkdir()
    ray_tmp = tempfile.mkdtemp(prefix="tlsig", dir="/tmp")  # (Ray's socket paths stay short)
    env = {**os.environ, "RAY_TMPDIR": ray_tmp, "RAY_USAGE_STATS_ENABLED": "0", "HOME": str(home)}
    env.pop("RAY_ADDRESS", None)
    db = tmp_path / "s.duckdb"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tracelab.cli", "ingest", str(traces), "--db", str(db),
         "--engine", "ray", "--workers", "1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not _running_under(ray_tmp):  # the instance's first process (its GCS) is up
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
        time.sleep(after_s)
        proc.send_signal(signal.SIGTERM)
        if twice:
            time.sleep(0.05)
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 143, err
        assert "terminated" in err and "Traceback" not in err and "SIGTERM received" not in err
        time.sleep(1.0)
        assert _running_under(ray_tmp) == []
        assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
        if db.exists():
            with open_store(db, read_only=True) as con:
                assert con.execute("SELECT count(*) FROM runs").fetchone() == (0,)
    finally:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        for line in _running_under(ray_tmp):  # a failed run's leftovers
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(line.partition(":")[0]), signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)


def test_an_ipv6_address_is_reached(tmp_path: Path) -> None:
    from tracelab.ingest.ray_engine import _reachable

    try:
        listener = socket.socket(socket.AF_INET6)
        listener.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    with listener:
        listener.listen()
        _reachable(f"[::1]:{listener.getsockname()[1]}")  # as Ray writes it: no UsageError
