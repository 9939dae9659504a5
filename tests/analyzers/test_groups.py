"""Process groups and dimensions without a job: the mesh arithmetic, `--mesh` parsing, and the
timing inference on hand-made collectives with a known layout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.foundation.hostile import cli
from tracelab.derived.group_inference import Inference, Op, stride_layouts
from tracelab.derived.groups import _pattern_dim, mesh_groups, parse_mesh
from tracelab.ingest import ingest
from tracelab.store import open_store
from tracelab.testing.synth import MS, RankTrace, write_ranks


def test_mesh_groups_are_the_slices_of_each_dimension() -> None:
    got = mesh_groups(["dp_shard", "tp"], [2, 2])
    assert got == {"dp_shard": [(0, 2), (1, 3)], "tp": [(0, 1), (2, 3)]}
    # A layout the collector recorded (ranks not row-major) is taken as given.
    assert mesh_groups(["tp"], [2], [3, 1]) == {"tp": [(3, 1)]}
    got3 = mesh_groups(["pp", "dp", "tp"], [2, 2, 2])
    assert got3["dp"] == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert got3["pp"] == [(0, 4), (1, 5), (2, 6), (3, 7)]


def test_parse_mesh() -> None:
    assert parse_mesh("dp_shard=2, tp=2") == {"names": ["dp_shard", "tp"], "shape": [2, 2]}
    for bad in ("dp_shard", "dp=x", "dp=0", "xx=2", "tp=2,tp=2"):
        with pytest.raises(ValueError, match="--mesh"):
            parse_mesh(bad)


def test_stride_layouts_of_four_ranks() -> None:
    assert stride_layouts(4) == [
        [(0, 1), (2, 3)],
        [(0, 2), (1, 3)],
        [(0, 1, 2, 3)],
    ]


def _ops(layout: list[tuple[int, ...]], tid: int, op: str, shifts: dict[int, int]) -> list[Op]:
    """Three collectives per step on every group of `layout`: ranks of one group overlap, the
    groups are `shifts[first rank]` ms apart."""
    out = []
    for g in layout:
        for k in range(3):
            t = k * 10_000_000 + shifts[g[0]] * 1_000_000
            for i, r in enumerate(g):
                out.append(
                    Op(rank=r, event_idx=100 * tid + 10 * k + i, tid=tid, op=op, step=1,
                        start_ns=t + i * 100_000, end_ns=t + 2_000_000, bytes=None)
                )  # fmt: skip
    return out


def test_inference_finds_each_thread_class_its_layout() -> None:
    """TP all-reduces on {0,1},{2,3} and FSDP all-gathers on {0,2},{1,3}, the second group of
    each layout 5 ms behind the first: any other layout matches collectives that do not
    overlap."""
    tp, fsdp = [(0, 1), (2, 3)], [(0, 2), (1, 3)]
    ops = _ops(tp, 7, "all_reduce", {0: 0, 2: 5}) + _ops(fsdp, 3, "all_gather", {0: 0, 1: 5})
    layouts = stride_layouts(4)
    inf = Inference(ops, layouts)
    choice, (bad, unmatched, matches), _ = inf.solve()
    # Thread classes in thread-id order: tid 3 (FSDP) is class 0, tid 7 (TP) class 1.
    assert [layouts[c] for c in choice] == [fsdp, tp]
    assert (bad, unmatched, matches) == (0, 0, 12)
    # The layouts of the two classes swapped: every match fails to overlap.
    assert inf.cost([layouts.index(tp), layouts.index(fsdp)])[0] == 12


def test_inference_prefers_the_whole_group_when_every_rank_overlaps() -> None:
    """A collective of the whole world overlaps within its subgroups too: the largest layout
    that overlaps wins."""
    world = [(0, 1, 2, 3)]
    ops = _ops(world, 1, "all_reduce", {0: 0})
    layouts = stride_layouts(4)
    choice, (bad, _, _), _ = Inference(ops, layouts).solve()
    assert layouts[choice[0]] == world and bad == 0


@pytest.mark.parametrize(
    ("ops", "fwd", "marked", "dim"),
    [
        ({"all_gather", "all_reduce"}, True, True, "dp_shard"),
        ({"reduce_scatter"}, False, True, "dp_shard"),
        ({"all_reduce"}, True, True, "tp"),
        ({"all_reduce"}, False, True, "dp"),
        ({"all_reduce"}, False, False, "dp"),
        ({"send", "recv"}, False, True, "pp"),
        ({"all_to_all"}, False, True, "ep"),
        ({"barrier"}, False, True, None),
    ],
)
def test_pattern_dims(ops: set[str], fwd: bool, marked: bool, dim: str | None) -> None:
    hit = _pattern_dim(ops, fwd, marked)
    assert (hit[0] if hit else None) == dim


def test_inference_by_descent_on_eight_ranks() -> None:
    """Five thread classes on five different layouts of 8 ranks (6^5 assignments: more than
    the exhaustive search tries) are found by the descent."""
    cands = stride_layouts(8)
    want = [cands[i] for i in (0, 1, 2, 3, 4)]
    ops = []
    for tid, layout in enumerate(want):
        shifts = {g[0]: 3 * n for n, g in enumerate(layout)}
        ops += _ops(layout, tid, "all_reduce", shifts)
    inf = Inference(ops, cands)
    assert len(cands) ** len(inf.classes) > 4096
    choice, (bad, unmatched, _), _ = inf.solve()
    assert [cands[c] for c in choice] == want
    assert (bad, unmatched) == (0, 0)


def test_a_group_named_only_by_its_ranks(tmp_path: Path) -> None:
    """Kernels that give `Process Group Ranks` but no name: each call matches within its
    ranks' group, though every rank's call has the same `Seq` (two groups, 0 and 1 ms apart:
    matched across the groups, rank 0's would end before rank 2 arrived)."""
    traces = [RankTrace(rank=r, world_size=4) for r in range(4)]
    for t in traces:
        t.step(1, 0, 20 * MS)
        group = [0, 1] if t.rank < 2 else [2, 3]
        start = (1 if t.rank < 2 else 5) * MS
        ev = t.nccl("all_reduce", start, start + 2 * MS, nbytes=1 << 20, group_ranks=group,
                    seq=1)  # fmt: skip
        del ev["args"]["Process Group Name"], ev["args"]["Process Group Description"]
    paths = write_ranks(tmp_path / "cap", traces)
    db = tmp_path / "s.duckdb"
    ingest(paths, db=db, run="r", workers=1, progress=False)
    with open_store(db) as con:
        keys = con.execute(
            "SELECT match_key, list(rank ORDER BY rank) FROM matched_collectives GROUP BY 1 "
            "ORDER BY 1"
        ).fetchall()
        (violations,) = con.execute(
            "SELECT sum(causality_violations) FROM clock_offsets"
        ).fetchall()[0]
        groups = con.execute(
            "SELECT group_key, members_from FROM process_groups ORDER BY 1"
        ).fetchall()
    assert keys == [("ranks:0,1:1", [0, 1]), ("ranks:2,3:1", [2, 3])]
    assert violations == 0
    # The default group (the trace's pg_config) and the two named by their ranks.
    assert groups == [("0", "trace"), ("ranks:0,1", "trace"), ("ranks:2,3", "trace")]


def test_a_named_groups_ranks_are_stored_once_per_run(tmp_path: Path) -> None:
    """Every call of a named group carries the same `Process Group Ranks`: the collectives
    table keeps the list on the group's first call in the run only (its lowest rank's; at
    10,000 ranks the list on every call grew as ranks x calls x group size and the ingest ran
    out of memory), and the group still has its members and every call its group. Two groups:
    'tp' (ranks by pair), then the default group '0'."""
    traces = [RankTrace(rank=r, world_size=4) for r in range(4)]
    for t in traces:
        t.step(1, 0, 30 * MS)
        pair = [0, 1] if t.rank < 2 else [2, 3]
        for i in range(3):
            ev = t.nccl("all_reduce", (1 + 3 * i) * MS, (2 + 3 * i) * MS, nbytes=1 << 20,
                        group_ranks=pair, seq=i + 1)  # fmt: skip
            ev["args"]["Process Group Name"] = "tp" + str(pair[0])
        for i in range(2):
            t.nccl("all_reduce", (12 + 3 * i) * MS, (13 + 3 * i) * MS, nbytes=1 << 20, seq=i + 1)
    stored, groups, matched = _ingested_rows(
        write_ranks(tmp_path / "cap", traces),
        tmp_path,
        "SELECT rank, pg_name, count(*), count(pg_ranks), "
        "arg_min(CAST(pg_ranks AS INTEGER[]), start_ns) FROM collectives "
        "WHERE source = 'kernel' GROUP BY ALL ORDER BY ALL",
        GROUPS_SQL,
        "SELECT pg_name, count(DISTINCT match_key), count(*) FROM matched_collectives "
        "GROUP BY 1 ORDER BY 1",
    )
    first = {"0": 0, "tp0": 0, "tp2": 2}  # each group's lowest rank
    members = {"0": [0, 1, 2, 3], "tp0": [0, 1], "tp2": [2, 3]}
    assert stored == [
        (r, name, n, int(first[name] == r), members[name] if first[name] == r else None)
        for r in range(4)
        for name, n in (("0", 2), ("tp0" if r < 2 else "tp2", 3))
    ]
    assert groups == [("0", [0, 1, 2, 3]), ("tp0", [0, 1]), ("tp2", [2, 3])]
    assert matched == [("0", 2, 8), ("tp0", 3, 6), ("tp2", 3, 6)]


def test_collector_records_keep_a_groups_ranks_once(tmp_path: Path) -> None:
    """The bundled DDP capture's records (a collector from before 2026-12) repeat the group's
    list on every line: the store keeps it on the group's first record of the run, and the
    group is the same."""
    capture = Path(__file__).resolve().parents[2] / "sample_traces" / "ddp_slow_rank"
    lines = sum(
        1
        for r in range(4)
        for line in (capture / f"rank-{r}" / "collectives.jsonl").read_text().splitlines()
        if '"pg_ranks":[0,1,2,3]' in line
    )
    assert lines > 100
    stored, groups = _ingested_rows(
        [capture],
        tmp_path,
        "SELECT pg_name, count(*), count(pg_ranks), arg_min(rank, start_ns) FILTER "
        "(WHERE pg_ranks IS NOT NULL), CAST(any_value(pg_ranks) AS INTEGER[]) "
        "FROM collectives WHERE source IN ('collector', 'flight_recorder') GROUP BY ALL",
        GROUPS_SQL,
    )
    assert stored == [("0", lines, 1, 0, [0, 1, 2, 3])]
    assert groups == [("0", [0, 1, 2, 3])]


GROUPS_SQL = "SELECT group_key, ranks FROM process_groups ORDER BY 1"


def _ingested_rows(paths: list[Path], tmp_path: Path, *queries: str) -> list[list[Any]]:
    """Ingest `paths` as one run into a new store; each query's rows."""
    db = tmp_path / "s.duckdb"
    ingest(paths, db=db, run="r", workers=1, progress=False)
    with open_store(db) as con:
        return [con.execute(q).fetchall() for q in queries]


def test_a_group_named_dp_that_shards_is_fsdp(tmp_path: Path) -> None:
    """PyTorch's FSDP + TP tutorial names its mesh dimensions ("dp", "tp"): a group named
    `mesh_dp` whose collectives are all-gathers and reduce-scatters is sharded data parallel
    (dp_shard), not DDP (whose advice, bucket sizes, it got); one of all-reduces stays dp."""
    traces = [RankTrace(rank=r, world_size=4) for r in range(4)]
    for t in traces:
        t.step(1, 0, 30 * MS)
        pair = [0, 2] if t.rank % 2 == 0 else [1, 3]
        for i, op in enumerate(("all_gather", "reduce_scatter")):
            ev = t.nccl(op, (1 + 3 * i) * MS, (2 + 3 * i) * MS, nbytes=1 << 20,
                        group_ranks=pair, seq=i + 1)  # fmt: skip
            ev["args"]["Process Group Name"] = f"fsdp{pair[0]}"
            ev["args"]["Process Group Description"] = "mesh_dp"
        other = [0, 1] if t.rank < 2 else [2, 3]
        ev = t.nccl("all_reduce", 10 * MS, 11 * MS, nbytes=1 << 20, group_ranks=other, seq=1)
        ev["args"]["Process Group Name"] = f"ddp{other[0]}"
        ev["args"]["Process Group Description"] = "mesh_dp"
    (dims,) = _ingested_rows(
        write_ranks(tmp_path / "cap", traces),
        tmp_path,
        "SELECT group_key, dim FROM process_groups WHERE group_key <> '0' ORDER BY 1",
    )
    assert dims == [("ddp0", "dp"), ("ddp2", "dp"), ("fsdp0", "dp_shard"), ("fsdp1", "dp_shard")]


@pytest.mark.parametrize("mesh", ["dp=3,tp=2", "dp=99999999999999999999,tp=2", "tp=2"])
def test_a_mesh_that_does_not_cover_the_job_is_refused_at_ingest(tmp_path: Path, mesh: str) -> None:
    """It was stored (exit 0), and `tracelab analyze` printed findings matched across the
    wrong groups before failing. Now: a usage error (exit 2) naming the job's size, and no
    store written."""
    traces = [RankTrace(rank=r, world_size=4) for r in range(4)]
    for t in traces:
        t.step(1, 0, 20 * MS)
    paths = write_ranks(tmp_path / "cap", traces)
    db = tmp_path / "s.duckdb"
    res = cli("ingest", "--db", str(db), "--mesh", mesh, *map(str, paths))
    assert res.code == 2, res.err
    assert "of a job of 4" in res.err and "multiply to 4" in res.err, res.err
    assert "Traceback" not in res.err
    assert not db.exists()
    assert cli("ingest", "--db", str(db), "--mesh", "dp=2,tp=2", *map(str, paths)).code == 0
