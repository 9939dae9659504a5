"""PyTorch 2026's communication args on NCCL kernels: `Comms Id` (equal on every rank for one
call) matches collectives without `Seq`, and `Src Rank` / `Dst Rank` name a send/recv's peer."""

from __future__ import annotations

from pathlib import Path

from tracelab.ingest import ingest
from tracelab.store import open_store
from tracelab.testing.synth import MS, RankTrace, write_ranks


def test_comms_id_matches_and_src_dst_name_the_peer(tmp_path: Path) -> None:
    traces = [RankTrace(rank=r, world_size=2) for r in range(2)]
    for t in traces:
        t.step(1, 0, 20 * MS)
        for i, (a, b) in enumerate([(1, 3), (5, 9)]):
            # Rank 1 reaches the second call first: only the id pairs them right.
            start = (a + (3 if t.rank == 0 and i == 1 else 0)) * MS
            ev = t.nccl("all_reduce", start, (b + 3) * MS, nbytes=1 << 20)
            ev["args"]["Comms Id"] = 7000 + i
        p2p = t.nccl("send" if t.rank == 0 else "recv", 14 * MS, 16 * MS, nbytes=4096)
        p2p["args"]["Dst Rank" if t.rank == 0 else "Src Rank"] = 1 - t.rank
    paths = write_ranks(tmp_path / "cap", traces)
    db = tmp_path / "s.duckdb"
    ingest(paths, db=db, run="r", workers=1, progress=False)
    with open_store(db) as con:
        seqs = con.execute(
            "SELECT rank, seq FROM collectives WHERE source = 'kernel' AND "
            "op = 'all_reduce' ORDER BY rank, seq"
        ).fetchall()
        peers = con.execute(
            "SELECT rank, op, peer FROM collectives WHERE op IN ('send', 'recv') ORDER BY rank"
        ).fetchall()
        keys = con.execute("SELECT count(DISTINCT match_key) FROM matched_collectives").fetchall()[
            0
        ][0]
    assert seqs == [(0, 7000), (0, 7001), (1, 7000), (1, 7001)]
    assert peers == [(0, "send", 1), (1, "recv", 0)]
    assert keys == 2
