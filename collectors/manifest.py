"""The capture layout's metadata: each rank's `rank.json` and rank 0's `manifest.json`.

Shapes are docs/capture-format.md's (format version 1). Every value that is not known is null,
never a guess: parallelism coordinates come from a DeviceMesh, else from the user, else stay
unknown.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import socket
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

FORMAT = "tracelab.capture"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
RANK_FILE = "rank.json"
DIMS = ("dp", "tp", "pp", "cp", "ep")
#: DeviceMesh dimension names folded into one standard dimension (torchtitan's names).
_MESH_ALIASES = {
    "dp": "dp",
    "dp_replicate": "dp",
    "dp_shard": "dp",
    "ddp": "dp",
    "fsdp": "dp",
    "tp": "tp",
    "pp": "pp",
    "cp": "cp",
    "ep": "ep",
    "dp_shard_cp": "dp",
}


def rank_dir(root: Path, rank: int) -> Path:
    return root / f"rank-{rank}"


def versions() -> dict[str, Any]:
    from tracelab import __version__

    nccl: str | None = None
    if torch.cuda.is_available():
        try:
            v = torch.cuda.nccl.version()
            nccl = ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)
        except Exception:
            nccl = None
    return {
        "tracelab": __version__,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": nccl,
        "python": platform.python_version(),
    }


def device_info(device: torch.device) -> tuple[str, int | None]:
    """(device name, capacity in bytes) of this rank's device."""
    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return props.name, int(props.total_memory)
    return "cpu", None


def process_groups(exclude: Any = None) -> list[dict[str, Any]]:
    """The process groups this rank belongs to, as distributedInfo.pg_config lists them."""
    if not (dist.is_available() and dist.is_initialized()):
        return []
    from torch.distributed.distributed_c10d import _world

    out = []
    for pg in list(_world.pg_map):
        if pg is exclude or pg is dist.GroupMember.NON_GROUP_MEMBER:
            continue
        try:
            out.append(
                {
                    "pg_name": str(pg.group_name),
                    "pg_desc": str(pg.group_desc),
                    "ranks": list(dist.get_process_group_ranks(pg)),
                    "backend": str(dist.get_backend(pg)),
                }
            )
        except Exception:
            continue
    out.sort(key=lambda g: (len(g["pg_name"]), g["pg_name"]))
    return out


def parallelism_from_mesh(mesh: Any) -> tuple[dict[str, Any], dict[str, int | None]]:
    """(manifest `parallelism`, this rank's coords) from a DeviceMesh with named dims.

    Dims the mesh does not name are 1 (coordinate 0): a mesh describes the whole layout.
    Several data-parallel dims (dp_replicate x dp_shard) fold into `dp`, row-major.
    """
    names = tuple(mesh.mesh_dim_names or ())
    shape = tuple(int(s) for s in mesh.mesh.shape)
    # The global rank at every mesh coordinate: the groups of each dimension are its slices
    # (tracelab.derived.groups), whatever order the ranks were laid out in.
    layout = {"names": list(names), "shape": list(shape), "ranks": mesh.mesh.tolist()}
    if not names or len(names) != len(shape) or any(n not in _MESH_ALIASES for n in names):
        return (
            {
                "dims": None,
                "source": "unknown",
                "mesh": layout,
            },
            {d: None for d in DIMS},
        )
    coord = mesh.get_coordinate()
    dims = {d: 1 for d in DIMS}
    coords: dict[str, int | None] = {d: 0 for d in DIMS}
    for name, size, c in zip(names, shape, coord or [None] * len(names)):
        std = _MESH_ALIASES[name]
        prev = dims[std]
        dims[std] = prev * size
        if c is None or coords[std] is None:
            coords[std] = None
        else:
            coords[std] = int(coords[std] or 0) * size + int(c)
    return (
        {
            "dims": dims,
            "source": "device_mesh",
            "mesh": layout,
        },
        coords,
    )


def parallelism_from_user(
    dims: Mapping[str, int] | None, coords: Mapping[str, int] | None, pp_stage: int | None
) -> tuple[dict[str, Any], dict[str, int | None]]:
    if not dims:
        return {"dims": None, "source": "unknown"}, {d: None for d in DIMS}
    full = {d: int(dims.get(d, 1)) for d in DIMS}
    given = dict(coords or {})
    if pp_stage is not None and "pp" not in given and full["pp"] > 1:
        given["pp"] = pp_stage
    out: dict[str, int | None] = {}
    for d in DIMS:
        out[d] = int(given[d]) if d in given else (0 if full[d] == 1 else None)
    return {"dims": full, "source": "user"}, out


def pipeline_info(pipeline: Any) -> tuple[dict[str, Any] | None, list[int] | None]:
    """(manifest `pipeline`, this rank's stage indices) from a dict or a pipelining schedule."""
    if pipeline is None:
        return None, None
    if isinstance(pipeline, Mapping):
        info = {
            "schedule": pipeline.get("schedule"),
            "stages": pipeline.get("stages"),
            "microbatches": pipeline.get("microbatches"),
        }
        stages = pipeline.get("rank_stages")
        return info, [int(s) for s in stages] if stages is not None else None
    sched_stages = getattr(pipeline, "_stages", None)
    if sched_stages is None and getattr(pipeline, "_stage", None) is not None:
        sched_stages = [pipeline._stage]
    rank_stages = [int(s.stage_index) for s in sched_stages] if sched_stages else None
    info = {
        "schedule": type(pipeline).__name__,
        "stages": int(getattr(pipeline, "_num_stages", 0)) or None,
        "microbatches": getattr(pipeline, "_n_microbatches", None),
    }
    return info, rank_stages


def host_name() -> str:
    return os.environ.get("TRACELAB_HOST") or socket.gethostname()


def write_json(path: Path, data: Any) -> None:
    """Write atomically (a reader never sees half a file)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n")
    os.replace(tmp, path)


def build_manifest(
    *,
    run_name: str,
    world_size: int,
    parallelism: dict[str, Any],
    pipeline: dict[str, Any] | None,
    schedule: dict[str, Any],
    windows: list[dict[str, Any]],
    ranks: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "run_name": run_name,
        "world_size": world_size,
        "created_unix_ns": time.time_ns(),
        "versions": versions(),
        "parallelism": parallelism,
        "pipeline": pipeline,
        "schedule": schedule,
        "windows": windows,
        "argv": list(sys.argv),
        "ranks": sorted(ranks, key=lambda r: int(r["rank"])),
    }


@contextlib.contextmanager
def manifest_lock(root: Path) -> Iterator[None]:
    """Serialize rank 0's manifest write with the late ranks' `add_rank`: an exclusive flock on
    the capture folder itself (no lock file in the layout). Where flock is not available (not
    POSIX, a file system without it) the write goes on unlocked: the manifest is still written
    whole (write_json is atomic), a late rank may then be missed."""
    try:
        import fcntl

        fd = os.open(root, os.O_RDONLY)
    except (ImportError, OSError):
        yield
        return
    try:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def add_rank(root: Path, entry: Mapping[str, Any]) -> bool:
    """Add this rank's entry to a manifest that rank 0 wrote without it, and say whether it
    did. A job that ends in a collective's timeout never gathers its ranks' metadata: rank 0
    fails first and builds the manifest from the rank.json files it can see, while a rank
    still stuck (or asleep) writes its rank.json later; without this, that rank's traces
    would be on disk and missing from the capture. Under manifest_lock, rank 0's write and
    this one cannot interleave: either the manifest exists here, or rank 0 reads this rank's
    rank.json, written before."""
    path = root / MANIFEST
    with manifest_lock(root):
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError):
            return False  # not written yet: rank 0 reads this rank's rank.json
        ranks = manifest.get("ranks")
        if not isinstance(ranks, list) or any(
            isinstance(r, dict) and r.get("rank") == entry["rank"] for r in ranks
        ):
            return False
        manifest["ranks"] = sorted([*ranks, dict(entry)], key=lambda r: int(r["rank"]))
        write_json(path, manifest)
        return True


def read_rank_parts(root: Path) -> list[dict[str, Any]]:
    """Every rank.json found under `root` (the fallback when the gather failed)."""
    out = []
    for part in sorted(root.glob(f"rank-*/{RANK_FILE}")):
        try:
            out.append(json.loads(part.read_text()))
        except (OSError, ValueError):
            continue
    return out
