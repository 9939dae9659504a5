"""Real captures with a known fault, made with plain torch.profiler, and tracelab's diagnosis.

Issue 11, "Proof": 4-rank torchrun + gloo jobs on CPU, profiled the way a user without tracelab
would (torch.profiler with a schedule and tensorboard_trace_handler, one trace file per rank,
no tracelab.profile, no collector), are ingested with `tracelab ingest` and analyzed with
`tracelab analyze --format json`. The tests compare the diagnosis with the injected fault.

Everything the tests assert against is in this file: PROFILER (steps), DDP_SCENARIOS and
ASYNC_SCENARIOS (the faults) and PIPELINE (the schedules). Three torchrun launches make all
captures: scripts/ddp_faults.py runs the DDP scenarios one after another in one process group,
scripts/async_faults.py the FSDP2 and tensor-parallel ones, and scripts/pipelines.py every
pipelining schedule. Each capture is then ingested into its own
store and analyzed once per session.

Environment:
- TRACELAB_DIAG_CAPTURES=DIR: read the captures from DIR/<name>/ (as written by a previous run
  or kept with TRACELAB_DIAG_KEEP) instead of launching torchrun.
- TRACELAB_DIAG_KEEP=DIR: copy each capture's trace folder to DIR/<name>/ after it is made.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
REPO = HERE.parents[1]

# The collectors' torchrun helper (free port, OMP_NUM_THREADS=1, fails the test with the
# job's output). tests/collectors is not a package, so load its conftest by path.
_spec = importlib.util.spec_from_file_location(
    "tracelab_tests_collectors_conftest", REPO / "tests" / "collectors" / "conftest.py"
)
assert _spec and _spec.loader
_collectors = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = _collectors
_spec.loader.exec_module(_collectors)
run_torchrun: Callable[..., subprocess.CompletedProcess[str]] = _collectors.run_torchrun

WORLD = 4
MS = 1_000_000

#: torch.profiler.schedule: `warmup` steps traced but dropped, then `active` recorded steps.
PROFILER = {"warmup": 2, "active": 10}

#: The injected faults. Step time of the healthy model is ~10-20 ms on 2 shared cores.
SLEEP = {"rank": 2, "ms": 60}
#: 80 x tanh(h @ w) with 320 x 320 matrices: ~110 ms a step on an idle core. With 256 x 256
#: (~25-35 ms) the fault was no larger than the exposed all-reduce transfer every run of this
#: model has (21-28 ms/step on the shared cores), and which comes first was a coin toss; at 40
#: (~55 ms) the impact came out at 0.68x the fault's wall time in one full run (31.2 ms against
#: 45.7: the others' compute is stretched by the load too, which a larger fault dilutes).
EXTRA_COMPUTE = {"rank": 1, "count": 80, "size": 320}
#: The model of the clean, sleep and compute runs: 4 layers of 256x256 (256 KiB of gradients
#: each) in 0.2 MB buckets, so several gradient all-reduces a step: the slow rank is late at
#: the first bucket and the others catch up at the later ones (issue 11's failure case).
SMALL_MODEL = {"width": 256, "layers": 4}
SMALL_BUCKET_MB = 0.2
#: A host stall of 30-50 ms on one rank of a model with several buckets (issue 21, section 3):
#: 6 layers of 256x256 in 0.25 MB buckets, 7 all-reduces a step. With BUCKETS' 1 MiB layers the
#: healthy model's own exposed transfer was 38-74 ms a step under load, as large as the fault;
#: with these 256 KiB ones 24 ms (main's shortest-duration transfer: 33 ms, with a 40 ms sleep).
BUCKET_SLEEP = {"rank": 2, "ms": 50}
SLEEP_BUCKETS = {"model": {"width": 256, "layers": 6}, "bucket_cap_mb": 0.25}
#: Several layers of 512x512 (1 MiB of gradients each) and 0.25 MB buckets: one all-reduce
#: per layer, 7 a step, each started as soon as its layer's gradients are ready.
BUCKETS = {"model": {"width": 512, "layers": 6}, "bucket_cap_mb": 0.25}

DDP_SCENARIOS: dict[str, dict[str, Any]] = {
    "ddp_clean": {"model": SMALL_MODEL, "bucket_cap_mb": SMALL_BUCKET_MB},
    "ddp_sleep": {"model": SMALL_MODEL, "bucket_cap_mb": SMALL_BUCKET_MB, "sleep": SLEEP},
    "ddp_compute": {
        "model": SMALL_MODEL,
        "bucket_cap_mb": SMALL_BUCKET_MB,
        "extra_matmuls": EXTRA_COMPUTE,
    },
    "ddp_buckets": BUCKETS,
    # Issue 21: the sleeping rank's several buckets queue on its gloo threads behind one
    # another; the others' waiting must not read as transfer.
    "ddp_sleep_buckets": {**SLEEP_BUCKETS, "sleep": BUCKET_SLEEP},
}

#: A 2-rank DDP job (its own torchrun launch): with two ranks per collective, the median of
#: both is halfway to the slow one, and the what-if replay blamed the sleeping rank for half
#: its sleep (29.9 ms against 60-62 ms) until each rank alone ran at its *peers'* median.
SLEEP_OF_TWO = {"rank": 1, "ms": 60}
DDP2_SCENARIOS: dict[str, dict[str, Any]] = {
    "ddp2_sleep": {"model": SMALL_MODEL, "bucket_cap_mb": SMALL_BUCKET_MB, "sleep": SLEEP_OF_TWO},
}

#: Issue 20: FSDP2 and DTensor TP issue collectives asynchronously and block later (in
#: `_c10d_functional::wait_tensor`, or a work's untraced wait() inside an autograd hook).
#: One rank computes more between forward and backward, where the ranks have just met: at the
#: step's start the fault would overlap the others' ends of the previous step, which vary by
#: tens of ms on 2 shared cores. Each gloo collective costs ~5-10 ms there whatever its size
#: (worker threads waiting for a core), so the models are small in collectives: FSDP2 shards
#: the root module only (one all-gather and one reduce-scatter a step; with every block
#: sharded too the healthy job's exposed transfer was as large as the fault), TP two MLP
#: blocks (three all-reduces a step).
#: The faults are two to three times the healthy job's exposed transfer: at 22 matmuls (~30 ms)
#: FSDP2's all-gather/reduce-scatter transfer (22-26 ms a step under the full suite's load) tied
#: with the fault and ranked above it in one CI run in four.
FSDP_COMPUTE = {"rank": 1, "count": 50, "size": 320}  # ~70 ms on an idle core
TP_COMPUTE = {"rank": 1, "count": 40, "size": 320}  # ~55 ms on an idle core
ASYNC_SCENARIOS: dict[str, dict[str, Any]] = {
    "fsdp_compute": {
        "kind": "fsdp",
        "width": 256,
        "layers": 2,
        "batch": 64,
        "shard_blocks": False,
        "extra_matmuls": FSDP_COMPUTE,
    },
    "tp_compute": {
        "kind": "tp",
        "width": 256,
        "layers": 2,
        "batch": 32,
        "extra_matmuls": TP_COMPUTE,
    },
}

#: Every torch.distributed.pipelining schedule (scripts/pipelines.py places the stages) and the
#: schedule name tracelab should report for it (tracelab.derived.pipeline.TORCH_SCHEDULES).
PIPELINE_SCHEDULES = {
    "gpipe": "gpipe",
    "1f1b": "1f1b",
    "interleaved_1f1b": "interleaved_1f1b",
    "looped_bfs": "looped_bfs",
    "interleaved_zb": "zero_bubble",
    "zbv": "zbv",
    "dualpipev": "dualpipev",
}
#: Stages per rank of each schedule.
STAGES_PER_RANK = {
    "gpipe": 1,
    "1f1b": 1,
    "interleaved_1f1b": 2,
    "looped_bfs": 2,
    "interleaved_zb": 2,
    "zbv": 2,
    "dualpipev": 2,
}
PIPELINE = {"width": 512, "layers_per_stage": 2, "microbatches": 8, "microbatch_size": 32}

#: All-to-all workloads (scripts/all_to_all.py), 16 recorded steps each: a DLRM-like exchange
#: of pooled embeddings where rank 1 holds 4x the tables (4x the lookups, 4x the bytes it
#: sends); an MoE-like dispatch where every rank sends rank 2 9x the tokens it sends each
#: other rank, and rank 2 runs its expert on them (a2a_moe_train: the same, trained:
#: autograd's all-to-alls and the expert's backward); the same with even splits and rank 3
#: running its expert 12x. Each fault costs ~100-250 ms a step: on 2 shared cores every gloo
#: call's own duration is 5-7 ms (scheduling), so a smaller fault competes with EXPOSED_COMM,
#: as in DDP_SCENARIOS; and the ranks leave each all-to-all up to a scheduling quantum or two
#: apart (10-40 ms under the full suite's load), which moves the faulty rank's measured
#: lateness against the replay's saving by as much. At ~50-80 ms (an expert of 16 repeats, a
#: 6x slow rank) the impact came out at 0.75x and 1.45x the cost in loaded runs (a2a_moe_slow
#: beside the app tests; a2a_moe_uneven in CI). DLRM keeps bags of 2000: with 4000 the
#: lookups became memory-bound, and a healthy rank's CPU time swung from 70 to 255 ms. Its
#: rows are 128 wide: at 32 the lookups were 8 ms of a healthy rank's ~40 ms (the rest is
#: drawing the indices, which the load stretches at random), the fault cost ~40 ms, and in
#: one CI run its saving came out at 26.9 ms with 54.7 ms of waiting left to SYNC_WAIT,
#: which ranked first; at 128 the lookups are ~35 ms of ~50, and in four runs (alone, and
#: beside one or two busy-looping processes) the fault cost 121-188 ms a step and the impact
#: came out at 0.92-0.97x it.
#:
#: The healthy ranks' work is kept small (~10-20 ms) and the fault large: 4 ranks share 2
#: cores, so the healthy ranks' work is what the scheduler stretches at random, and a step
#: costs what the faulty rank finishes after the *slowest* of the others (what the what-if
#: replay measures). With 3x faults over ~20-30 ms of healthy work (the earlier sizes) a peer
#: stretched by the load took a third of the fault's time from the saving (0.6-0.7x of the
#: extra work over the median peer) and left the rest to SYNC_WAIT, which then ranked first
#: in loaded runs. The tables are small (2000 rows) so the lookups are not bound by a memory
#: bus the other jobs share. DLRM keeps the issue's 4x.
A2A_PROFILER = {"warmup": 2, "active": 16}
A2A_SCENARIOS: dict[str, dict[str, Any]] = {
    "a2a_dlrm": {
        "kind": "dlrm",
        "tables": 8,
        "dim": 128,
        "rows": 2000,
        "bag": 2000,
        "batch": 64,
        "heavy": {"rank": 1, "factor": 4},
    },
    "a2a_moe_uneven": {
        "kind": "moe",
        "width": 128,
        "tokens": 512,
        "expert_repeat": 32,
        "hot_rank": 2,
        "hot_factor": 9,
    },
    "a2a_moe_train": {
        "kind": "moe",
        "width": 128,
        "tokens": 512,
        "expert_repeat": 8,
        "hot_rank": 2,
        "hot_factor": 9,
        "backward": True,
    },
    # Rank 2 receives 4x the tokens but its expert is one small layer: what the others wait
    # for is its 120 ms sleep (a host stall), not the extra data (it was read as unbalanced
    # data "computing 0 ms more per step").
    "a2a_moe_sleepy": {
        "kind": "moe",
        "width": 128,
        "tokens": 512,
        "expert_repeat": 1,
        "hot_rank": 2,
        "hot_factor": 4,
        "sleep_rank": 2,
        "sleep_ms": 120,
    },
    "a2a_moe_slow": {
        "kind": "moe",
        "width": 128,
        "tokens": 256,
        "expert_repeat": 16,
        "slow_rank": 3,
        "slow_factor": 12,
    },
}

# a2a_moe_uneven profiled without record_shapes (torch.profiler's default): the trace has no
# all-to-all sizes, and the splits were called even ("0.00x its peers' mean").
A2A_SCENARIOS["a2a_moe_noshapes"] = {**A2A_SCENARIOS["a2a_moe_uneven"], "record_shapes": False}

CAPTURES = [
    *DDP_SCENARIOS,
    *DDP2_SCENARIOS,
    *ASYNC_SCENARIOS,
    *(f"pp_{s}" for s in PIPELINE_SCHEDULES),
    *A2A_SCENARIOS,
]


@dataclass
class Diagnosis:
    """One capture ingested into its own store and analyzed: the CLI's exit code, output and
    JSON document."""

    name: str
    traces: Path
    db: Path
    rc: int
    stdout: str
    stderr: str
    doc: dict[str, Any] = field(default_factory=dict)

    @property
    def findings(self) -> list[dict[str, Any]]:
        return self.doc.get("findings", [])

    def codes(self) -> list[str]:
        return [f["code"] for f in self.findings]

    @property
    def fault(self) -> dict[str, Any]:
        """What the injected fault cost, as measured by the faulty rank itself (perf_counter):
        {"rank", "recorded_ns": [ns per recorded step]} (scripts/ddp_faults.py)."""
        path = self.traces.parent / f"{self.name}.fault.json"
        return json.loads(path.read_text())

    def sql(self, query: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        """Rows of a read-only query on the capture's store ($run = its run_id)."""
        from tracelab.store import open_store, resolve_run

        with open_store(self.db) as con:
            rid, _ = resolve_run(con, self.name)
            cur = con.execute(query.replace("$run", str(int(rid))), params or [])
            cols = [d[0] for d in cur.description]
            return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def summary(self, top: int = 3) -> str:
        """The top findings, for assertion messages."""
        out = []
        for f in self.findings[:top]:
            imp = f.get("impact_ns_per_step")
            out.append(
                f"{f['code']} ranks={f['evidence'].get('ranks')} "
                f"impact={'-' if imp is None else f'{imp / MS:.1f} ms'}"
            )
        step = self.doc.get("lost_time", {}).get("step_ns")
        return f"{self.name}: step {step and step / MS:.1f} ms; " + "; ".join(out)


def _tracelab(*args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from tracelab.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        check=False,
    )


def _diagnose(name: str, traces: Path, work: Path) -> Diagnosis:
    db = work / f"{name}.duckdb"
    ing = _tracelab("ingest", str(traces), "--db", str(db), "--run", name)
    if ing.returncode != 0:
        pytest.fail(f"tracelab ingest {name} failed ({ing.returncode}):\n{ing.stderr[-4000:]}")
    ana = _tracelab("analyze", "--db", str(db), "--run", name, "--format", "json")
    diag = Diagnosis(
        name=name, traces=traces, db=db, rc=ana.returncode, stdout=ana.stdout, stderr=ana.stderr
    )
    try:
        diag.doc = json.loads(ana.stdout)
    except json.JSONDecodeError:
        diag.doc = {}
    return diag


def _launch(script: Path, out: Path, spec: dict[str, Any], nproc: int) -> None:
    """run_torchrun, launched once more into an emptied folder when a signal killed a worker:
    gloo's threads on CPU sometimes abort a rank as its process exits ("terminate called
    without an active exception", exitcode -6, after the profiler stopped), which took the
    all-to-all captures, and 38 tests on them, down once in a full run. An error of the script
    itself (exitcode 1) is not retried."""
    for attempt in (1, 2):
        try:
            run_torchrun(script, str(out), json.dumps(spec), nproc=nproc)
            return
        except pytest.fail.Exception as exc:
            if attempt == 2 or not re.search(r"exitcode\s*:\s*-\d+", str(exc)):
                raise
            shutil.rmtree(out)
            out.mkdir()


def _captures(tmp: pytest.TempPathFactory, kind: str) -> Path:
    """The folder holding the traces of one launch's captures, one subfolder per capture."""
    cached = os.environ.get("TRACELAB_DIAG_CAPTURES")
    if cached:
        return Path(cached)
    out = tmp.mktemp(kind)
    if kind == "ddp":
        spec = {
            "profiler": PROFILER,
            "scenarios": [{"name": n, **sc} for n, sc in DDP_SCENARIOS.items()],
        }
        _launch(SCRIPTS / "ddp_faults.py", out, spec, WORLD)
    elif kind == "ddp2":
        spec = {
            "profiler": PROFILER,
            "scenarios": [{"name": n, **sc} for n, sc in DDP2_SCENARIOS.items()],
        }
        _launch(SCRIPTS / "ddp_faults.py", out, spec, 2)
    elif kind == "a2a":
        spec = {
            "profiler": A2A_PROFILER,
            "scenarios": [{"name": n, **sc} for n, sc in A2A_SCENARIOS.items()],
        }
        _launch(SCRIPTS / "all_to_all.py", out, spec, WORLD)
    elif kind == "async":
        spec = {
            "profiler": PROFILER,
            "scenarios": [{"name": n, **sc} for n, sc in ASYNC_SCENARIOS.items()],
        }
        _launch(SCRIPTS / "async_faults.py", out, spec, WORLD)
    else:
        spec = {"profiler": PROFILER, "pipeline": PIPELINE, "schedules": list(PIPELINE_SCHEDULES)}
        _launch(SCRIPTS / "pipelines.py", out, spec, WORLD)
        for s in PIPELINE_SCHEDULES:  # the script names folders by schedule
            (out / s).rename(out / f"pp_{s}")
    keep = os.environ.get("TRACELAB_DIAG_KEEP")
    if keep:
        for sub in out.iterdir():
            dst = Path(keep) / sub.name
            if sub.is_dir():
                shutil.rmtree(dst, ignore_errors=True)
                shutil.copytree(sub, dst)
            else:
                shutil.copy2(sub, dst)
    return out


@pytest.fixture(scope="session")
def ddp_captures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _captures(tmp_path_factory, "ddp")


@pytest.fixture(scope="session")
def ddp2_captures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _captures(tmp_path_factory, "ddp2")


@pytest.fixture(scope="session")
def async_captures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _captures(tmp_path_factory, "async")


@pytest.fixture(scope="session")
def pipeline_captures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _captures(tmp_path_factory, "pipelines")


@pytest.fixture(scope="session")
def a2a_captures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _captures(tmp_path_factory, "a2a")


@pytest.fixture(scope="session")
def diagnose(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Diagnosis]:
    """diagnose(name) -> the capture's Diagnosis, made once per session."""
    cache: dict[str, Diagnosis] = {}
    work = tmp_path_factory.mktemp("stores")

    def get(name: str) -> Diagnosis:
        if name not in cache:
            if name.startswith("pp_"):
                launch = "pipeline_captures"
            elif name in ASYNC_SCENARIOS:
                launch = "async_captures"
            elif name.startswith("a2a_"):
                launch = "a2a_captures"
            elif name in DDP2_SCENARIOS:
                launch = "ddp2_captures"
            else:
                launch = "ddp_captures"
            root: Path = request.getfixturevalue(launch)
            traces = root / name
            if not traces.is_dir() or not any(traces.iterdir()):
                pytest.fail(f"no traces for {name} in {root}")
            cache[name] = _diagnose(name, traces, work)
        return cache[name]

    return get
