"""tracelab.collectors: capture traces, collective timings, memory peaks and clock offsets.

Users need one name, `tracelab.profile` (re-exported lazily by `tracelab`). Arm PyTorch's Flight
Recorder with `arm_flight_recorder()` before `init_process_group` so that collectives issued from
C++ (the DDP reducer, functional collectives) are captured too.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tracelab.collectors.config import DISABLE_ENV, ProfileConfig
from tracelab.collectors.flight_recorder import arm_flight_recorder
from tracelab.collectors.manifest import FORMAT_VERSION
from tracelab.collectors.profile import Profile

__all__ = [
    "DISABLE_ENV",
    "FORMAT_VERSION",
    "Profile",
    "ProfileConfig",
    "arm_flight_recorder",
    "profile",
]


def profile(
    dir: str | Path,
    *,
    steps: range | None = None,
    wait: int = 0,
    warmup: int = 1,
    active: int | None = None,
    repeat: int = 1,
    skip_first: int = 0,
    run_name: str | None = None,
    enabled: bool = True,
    mesh: Any = None,
    parallelism: Mapping[str, int] | None = None,
    coords: Mapping[str, int] | None = None,
    pipeline: Any = None,
    pp_stage: int | None = None,
    model: Any = None,
    optimizer: Any = None,
    device: Any = None,
    comm_timing: bool = True,
    flight_recorder: bool = True,
    memory: bool = True,
    memory_snapshot: bool = False,
    clock_sync: bool = True,
    record_shapes: bool = False,
    profile_memory: bool = False,
    with_stack: bool = False,
    control_timeout_s: float = 30.0,
    convert: bool = False,
) -> Profile:
    """Profile a training loop on every rank; call `.step()` once per training step.

    Which steps: `steps=range(10, 15)` records steps 10..14 after `warmup` (default 1) warm-up
    step(s); or torch.profiler's form `wait`, `warmup`, `active`, `repeat` (+ `skip_first`), one
    capture window per cycle. Each window writes `DIR/rank-N/window-K.pt.trace.json.gz`.

    Topology, recorded in the manifest: `mesh` (a DeviceMesh with named dims: dp, tp, pp, cp,
    ep, dp_replicate, dp_shard), or `parallelism={"dp": 2, "pp": 2}` with this rank's `coords`;
    `pipeline` (a torch.distributed.pipelining schedule, or a dict with schedule, stages,
    microbatches) and `pp_stage`. `model` and `optimizer` (a module/optimizer or a list of
    them; a pipeline's stages stand in for `model`) let the collector count the rank's
    parameter, gradient and optimizer-state bytes for the memory estimate.

    What is captured: `comm_timing` (every c10d collective and p2p op while a window is
    active), `flight_recorder` (its entries, when armed), `memory` (per-step peaks),
    `memory_snapshot` (CUDA allocator snapshot of the first recorded step), `clock_sync`
    (offsets to rank 0). `record_shapes`, `profile_memory` and `with_stack` go to
    torch.profiler. `control_timeout_s` bounds every wait on other ranks for tracelab's own
    messages. `convert` turns each window's trace into tracelab's columnar form in a child
    process on the rank's own node, so that `tracelab ingest` only registers it.

    Disabled (`enabled=False` or TRACELAB_DISABLE=1) it is a no-op. Internal errors are logged
    once and switch the collector off; the training loop never sees them.
    """
    config = ProfileConfig(
        dir=Path(dir),
        steps=steps,
        wait=wait,
        warmup=warmup,
        active=active,
        repeat=repeat,
        skip_first=skip_first,
        run_name=run_name,
        enabled=enabled,
        mesh=mesh,
        parallelism=parallelism,
        coords=coords,
        pipeline=pipeline,
        pp_stage=pp_stage,
        device=device,
        comm_timing=comm_timing,
        flight_recorder=flight_recorder,
        memory=memory,
        memory_snapshot=memory_snapshot,
        model=model,
        optimizer=optimizer,
        clock_sync=clock_sync,
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        with_stack=with_stack,
        control_timeout_s=control_timeout_s,
        convert=convert,
    )
    return Profile(config)
