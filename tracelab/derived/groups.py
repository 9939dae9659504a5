"""Process groups and their parallel dimensions (docs/metrics.md, "Process groups and parallel
dimensions"): which ranks each group holds, which dimension it serves, and, where the trace
names no group at all, which group each collective ran on.

Members come from the trace (`distributedInfo.pg_config`, the collectives' `Process Group
Ranks`), else from a mesh (`tracelab ingest --mesh`, or the DeviceMesh the collector recorded),
else they are inferred from timing. Plain torch.profiler traces of gloo jobs carry no group on
their `gloo:*` spans: the members of one collective overlap in time, so the layout is the
partition of the ranks under which every collective, matched by occurrence within its group,
overlaps its peers. The unit of the inference is a rank's communication thread (gloo runs each
process group on its own worker threads, NCCL each on its own stream): the k-th such thread of
every rank (by thread id) is one class, and every class gets one layout. The classes' layouts
are chosen together, the fewest matches that fail to overlap first.

A group's dimension comes, strongest first, from `--mesh` (`mesh`), the collector's DeviceMesh
(`collector`), the group's description or name (`trace`: DeviceMesh names its groups
`mesh_<dim>`), else its collectives' pattern (`inferred`): all-gathers or reduce-scatters are
FSDP, all-reduces issued before the step's backward are tensor parallel, all-reduces in the
backward only data parallel, send/recv pipeline, all-to-all expert parallel.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import pyarrow as pa

from tracelab.derived import sqlfiles
from tracelab.derived.group_inference import Inference, Op, layouts
from tracelab.vocabulary import DIM_ALIASES, P2P_OPS, Dim


@dataclass(kw_only=True)
class Group:
    """One process group of the run."""

    key: str
    ranks: tuple[int, ...]
    pg_name: str | None = None
    pg_desc: str | None = None
    members_from: str = "trace"
    dim: str = Dim.UNKNOWN.value
    source: str | None = None
    evidence: list[str] = field(default_factory=list)


def mesh_groups(
    names: Sequence[str], shape: Sequence[int], ranks: Any = None
) -> dict[str, list[tuple[int, ...]]]:
    """The groups of each named dimension of a mesh: the slices along that dimension of the
    rank layout (`ranks`, nested lists; default the row-major layout init_device_mesh uses)."""
    import numpy as np

    size = int(np.prod(shape)) if shape else 0
    grid = np.arange(size).reshape(shape) if ranks is None else np.asarray(ranks, dtype=int)
    out: dict[str, list[tuple[int, ...]]] = {}
    for axis, name in enumerate(names):
        moved = np.moveaxis(grid, axis, -1).reshape(-1, grid.shape[axis])
        out[str(name)] = [tuple(int(r) for r in row) for row in moved]
    return out


def parse_mesh(text: str) -> dict[str, Any]:
    """`--mesh "dp_shard=2,tp=2"` as run metadata: {"names": [...], "shape": [...]}, outermost
    dimension first (init_device_mesh's order). Raises ValueError naming the fix."""
    names: list[str] = []
    shape: list[int] = []
    for item in text.split(","):
        name, sep, size = item.strip().partition("=")
        name = name.strip()
        if not sep or not name or not size.strip().isdigit() or int(size) < 1:
            raise ValueError(
                f"--mesh takes NAME=SIZE pairs, outermost first (e.g. --mesh dp_shard=2,tp=2), "
                f"not {item.strip()!r}."
            )
        if name.lower() not in DIM_ALIASES:
            known = ", ".join(sorted(DIM_ALIASES))
            raise ValueError(f"--mesh: unknown dimension {name!r}; use one of {known}.")
        if name in names:
            raise ValueError(f"--mesh names {name!r} twice.")
        names.append(name)
        shape.append(int(size))
    return {"names": names, "shape": shape}


def _dim_of_name(*names: str | None) -> tuple[str, str] | None:
    """(dim, the name that said so) from a group's description or name: DeviceMesh's
    `mesh_tp`, torchtitan's `dp_shard`, ...; None when no name says."""
    for name in names:
        if not name:
            continue
        norm = name.lower().removeprefix("mesh_")
        if norm in DIM_ALIASES:
            return DIM_ALIASES[norm].value, name
    return None


def _stride_text(ranks: Sequence[int]) -> str:
    steps = {b - a for a, b in itertools.pairwise(ranks)}
    return f"stride {steps.pop()}" if len(steps) == 1 else "irregular strides"


def _pattern_dim(
    ops: set[str], forward_all_reduce: bool, backward_marked: bool
) -> tuple[str, str] | None:
    if not ops:
        return None
    listed = ", ".join(sorted(ops))
    if "all_to_all" in ops:
        return (
            Dim.EP.value,
            f"all-to-all ({listed}): expert parallel (context parallel too runs all-to-all; --mesh settles it)",
        )
    if ops <= set(P2P_OPS):
        return Dim.PP.value, "send/recv only: pipeline"
    if ops & {"all_gather", "reduce_scatter"}:
        return Dim.DP_SHARD.value, f"{listed}: parameter all-gathers and gradient reductions (FSDP)"
    if "all_reduce" in ops:
        if forward_all_reduce:
            return Dim.TP.value, "all-reduces in the forward and the backward (tensor parallel)"
        if backward_marked:
            return Dim.DP.value, "all-reduces in the backward only (data parallel)"
        return Dim.DP.value, (
            "all-reduces only (data parallel; the trace marks no backward pass that would "
            "tell tensor parallelism apart)"
        )
    return None


def derive(con: duckdb.DuckDBPyConnection, run_id: int) -> None:
    """Fill process_groups and collective_groups for the run (tracelab/derived/sql/)."""
    params = {"run": run_id}
    run = con.execute(
        "SELECT coalesce(world_size, 0), metadata FROM runs WHERE run_id = $run", params
    ).fetchone()
    meta = json.loads(run[1]) if run and run[1] else {}
    ranks = [
        int(r)
        for (r,) in con.execute(
            "SELECT rank FROM ranks WHERE run_id = $run ORDER BY rank", params
        ).fetchall()
    ]
    world = max(int(run[0]) if run else 0, (max(ranks) + 1) if ranks else 0)

    groups: dict[str, Group] = {}
    declared = con.execute(
        """
        SELECT DISTINCT g->>'pg_name', g->>'pg_desc', CAST(g->'ranks' AS INTEGER[])
        -- Each distinct configuration of the run's ranks, once (process_group_configs: 10,000
        -- ranks' copies of 10,000-rank lists unnested were 10^8 rows).
        FROM (SELECT unnest(CAST(process_groups AS JSON[])) AS g
              FROM process_group_configs WHERE run_id = $run)
        UNION
        SELECT DISTINCT pg_name, pg_desc, TRY_CAST(pg_ranks AS INTEGER[]) FROM collectives
        WHERE run_id = $run AND pg_name IS NOT NULL
        """,
        params,
    ).fetchall()
    for name, desc, members in declared:
        if name is None:
            continue
        g = groups.get(name)
        if g is None:
            g = groups[name] = Group(key=name, ranks=tuple(sorted(members or ())), pg_name=name)
        if desc and not g.pg_desc:
            g.pg_desc = desc
        if members and not g.ranks:
            g.ranks = tuple(sorted(members))

    by_ranks: dict[tuple[int, ...], Group] = {}
    for g in groups.values():
        by_ranks.setdefault(g.ranks, g)

    def group_for(members: tuple[int, ...], members_from: str) -> Group:
        if members in by_ranks:
            return by_ranks[members]
        key = "ranks:" + ",".join(map(str, members))
        g = groups[key] = by_ranks[members] = Group(
            key=key, ranks=members, members_from=members_from
        )
        return g

    # Meshes: --mesh at ingest, then the collector's DeviceMesh.
    meshes = []
    if isinstance(meta.get("mesh"), dict):
        meshes.append(("mesh", meta["mesh"], "--mesh"))
    par = (meta.get("manifest") or {}).get("parallelism") or {}
    if isinstance(par.get("mesh"), dict) and par["mesh"].get("names"):
        meshes.append(("collector", par["mesh"], "the collector's DeviceMesh"))
    for source, mesh, said in meshes:
        names, shape = list(mesh.get("names") or []), list(mesh.get("shape") or [])
        try:
            dims = mesh_groups(names, shape, mesh.get("ranks"))
        except ValueError as exc:
            raise ValueError(f"{said} {names} x {shape} is not a mesh: {exc}") from exc
        covered = {r for members_list in dims.values() for m in members_list for r in m}
        if world and len(covered) != world:
            shape_text = ",".join(f"{n}={s}" for n, s in zip(names, shape, strict=False))
            raise ValueError(
                f"{said} ({shape_text}) covers {len(covered)} ranks but the run has {world}: "
                "give the job's whole mesh (tracelab ingest --replace --mesh ...)"
            )
        for name, members_list in dims.items():
            dim = DIM_ALIASES.get(name.lower())
            for members in members_list:
                if len(members) < 2:
                    continue
                g = group_for(members, source)
                if g.source is None:
                    g.dim = (dim or Dim.UNKNOWN).value
                    g.source = source
                    shape_text = ",".join(f"{n}={s}" for n, s in zip(names, shape, strict=False))
                    g.evidence.append(f"{said} ({shape_text}) dimension {name!r}")

    for g in groups.values():
        if g.source is None:
            hit = _dim_of_name(g.pg_desc, g.pg_name)
            if hit is not None:
                g.dim, g.source = hit[0], "trace"
                g.evidence.append(f"the trace names the group {hit[1]!r}")

    # Collectives that name their group's ranks only (no name): that group.
    assigned = [
        (int(r), int(i), group_for(tuple(sorted(m)), "trace").key)
        for r, i, m in con.execute(
            """SELECT rank, event_idx, TRY_CAST(pg_ranks AS INTEGER[]) FROM collectives
               WHERE run_id = $run AND pg_name IS NULL AND event_idx IS NOT NULL
                 AND len(TRY_CAST(pg_ranks AS INTEGER[])) > 1""",
            params,
        ).fetchall()
    ]
    # Collectives that name no group: infer the layout.
    assigned += _infer(con, run_id, groups, world, ranks, group_for)

    # The pattern of each group's collectives, for groups nothing else names.
    _apply_patterns(con, run_id, groups, assigned)

    for g in groups.values():
        if world and g.ranks:
            g.evidence.append(f"{len(g.ranks)} of {world} ranks, {_stride_text(g.ranks)}")
    table = pa.table(
        {
            "group_key": pa.array([g.key for g in groups.values()], pa.string()),
            "pg_name": pa.array([g.pg_name for g in groups.values()], pa.string()),
            "pg_desc": pa.array([g.pg_desc for g in groups.values()], pa.string()),
            "ranks": pa.array([list(g.ranks) for g in groups.values()], pa.list_(pa.int32())),
            "members_from": pa.array([g.members_from for g in groups.values()], pa.string()),
            "dim": pa.array([g.dim for g in groups.values()], pa.string()),
            "source": pa.array([g.source for g in groups.values()], pa.string()),
            "evidence": pa.array(["; ".join(g.evidence) for g in groups.values()], pa.string()),
        }
    )
    cg = pa.table(
        {
            "rank": pa.array([r for r, _, _ in assigned], pa.int32()),
            "event_idx": pa.array([i for _, i, _ in assigned], pa.int64()),
            "group_key": pa.array([k for _, _, k in assigned], pa.string()),
        }
    )
    sqlfiles.run(con, "process_groups", params, {"_tl_groups": table})
    sqlfiles.run(con, "collective_groups", params, {"_tl_assigned": cg})


def _infer(
    con: duckdb.DuckDBPyConnection,
    run_id: int,
    groups: dict[str, Group],
    world: int,
    ranks: list[int],
    group_for: Any,
) -> list[tuple[int, int, str]]:
    """(rank, event_idx, group key) of every host collective that names no group."""
    rows = con.execute(
        """
        SELECT c.rank, c.event_idx, e.tid, c.op, coalesce(c.step, -1), c.start_ns, c.end_ns,
               c.in_bytes
        FROM collectives c JOIN events e ON e.run_id = c.run_id AND e.rank = c.rank
             AND e.idx = c.event_idx
        WHERE c.run_id = $run AND c.source = 'host' AND c.pg_name IS NULL
          AND c.pg_ranks IS NULL
          AND c.start_ns IS NOT NULL AND c.end_ns IS NOT NULL AND c.event_idx IS NOT NULL
          AND c.op NOT IN ('send', 'recv', 'send_recv')
        """,
        {"run": run_id},
    ).fetchall()
    ops = [
        Op(
            rank=r[0],
            event_idx=r[1],
            tid=r[2] or 0,
            op=r[3],
            step=r[4],
            start_ns=r[5],
            end_ns=r[6],
            bytes=r[7],
        )
        for r in rows
    ]
    if world < 2 or len({o.rank for o in ops}) < 2:
        return []
    cands = layouts([g.ranks for g in groups.values()], world)
    inf = Inference(ops, cands)
    choice, (bad, unmatched, matches), alt = inf.solve()
    out: list[tuple[int, int, str]] = []
    unit = "thread classes" if inf.by_thread else "threads"
    why: dict[str, tuple[list[int], list[tuple[int, int, int]]]] = {}
    for i, cls in enumerate(sorted(inf.classes)):
        group_of = {r: g for g in cands[choice[i]] for r in g}
        for o in inf.classes[cls]:
            g = group_for(group_of[o.rank], "inferred")
            out.append((o.rank, o.event_idx, g.key))
            classes, alts = why.setdefault(g.key, ([], []))
            if cls not in classes:
                classes.append(cls)
                if i in alt:
                    alts.append(alt[i])
    for key, (classes, alts) in why.items():
        nxt = min(alts) if alts else None
        groups[key].evidence.append(
            f"its collectives placed by timing ({unit} {', '.join(map(str, classes))} of every "
            f"rank): {matches} matches, {bad} fail to overlap"
            + (f"; the next best layout fails {nxt[0]} of {nxt[2]}" if nxt else "")
        )
    return out


def _apply_patterns(
    con: duckdb.DuckDBPyConnection,
    run_id: int,
    groups: dict[str, Group],
    assigned: list[tuple[int, int, str]],
) -> None:
    """Dimensions from each group's collectives, for groups nothing named; groups of one
    layout (the same size and stride) share what any of them shows."""
    amap = pa.table(
        {
            "rank": pa.array([r for r, _, _ in assigned], pa.int32()),
            "event_idx": pa.array([i for _, i, _ in assigned], pa.int64()),
            "group_key": pa.array([k for _, _, k in assigned], pa.string()),
        }
    )
    with sqlfiles.registered(con, {"_tl_amap": amap}):
        rows = con.execute(
            """
            WITH bw AS (
                SELECT rank, step, min(ts_ns) AS bwd_ns FROM events
                WHERE run_id = $run AND NOT on_device
                  AND name LIKE 'autograd::engine::evaluate_function:%'
                GROUP BY rank, step
            ),
            c AS (
                SELECT coalesce(c.pg_name, a.group_key) AS gk, c.op, c.rank, c.step,
                       coalesce(c.enqueue_ns, c.start_ns) AS t
                FROM collectives c LEFT JOIN _tl_amap a ON a.rank = c.rank
                     AND a.event_idx = c.event_idx
                WHERE c.run_id = $run AND coalesce(c.pg_name, a.group_key) IS NOT NULL
            )
            SELECT gk, list(DISTINCT op),
                   bool_or(op = 'all_reduce' AND bw.bwd_ns IS NOT NULL AND t < bw.bwd_ns),
                   bool_or(bw.bwd_ns IS NOT NULL)
            FROM c LEFT JOIN bw USING (rank, step)
            GROUP BY gk
            """,
            {"run": run_id},
        ).fetchall()
    found: dict[tuple[int, str], tuple[str, str]] = {}
    for gk, ops, fwd, marked in rows:
        g = groups.get(gk)
        if g is None:
            continue
        hit = _pattern_dim(set(ops), bool(fwd), bool(marked))
        if g.source is not None:
            if hit is not None and g.dim == Dim.DP.value and hit[0] == Dim.DP_SHARD.value:
                # "dp" names data parallelism, not how: FSDP over a mesh dimension named "dp"
                # (PyTorch's FSDP + TP tutorial) got DDP's advice (bucket sizes).
                g.dim = Dim.DP_SHARD.value
                g.evidence.append(f"sharded, by its collectives: {hit[1]}")
            elif hit is not None and hit[0] != g.dim:
                g.evidence.append(f"but its collectives look like {hit[0]}: {hit[1]}")
            continue
        if hit is not None:
            g.dim, g.source = hit[0], "inferred"
            g.evidence.append("inferred from its collectives: " + hit[1])
            found[(len(g.ranks), _stride_text(g.ranks))] = hit
    for g in groups.values():
        if g.source is None and len(g.ranks) > 1:
            hit = found.get((len(g.ranks), _stride_text(g.ranks)))
            if hit is not None and len(g.ranks) < max(len(x.ranks) for x in groups.values()):
                g.dim, g.source = hit[0], "inferred"
                g.evidence.append("inferred: a group of the same layout shows " + hit[1])
