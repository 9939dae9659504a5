"""The hang verdict as a finding: where the ranks of a hung or desynchronized job parted.

The verdict is `tracelab hang`'s, made at ingest from the Flight Recorder dumps stored with the
run (hang_verdicts; tracelab.hang.stored, docs/hang.md). A hang stops the job: it is the root
cause of everything after it, so its finding comes before every other (vocabulary.BLOCKING),
and it claims no lost time (the job did not slow down, it stopped).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import duckdb

from tracelab.analyzers._common import RunContext, merge_params
from tracelab.hang.render import absent_ranks, entry_text, headline, shape_text
from tracelab.hang.stored import stored_verdicts
from tracelab.results import Evidence, Finding, Result, Severity
from tracelab.vocabulary import P2P_OPS, Code

NAME = "hang"
TITLE = "Hang verdict (Flight Recorder)"
VIEW = "overview"
DEFAULTS: dict[str, Any] = {}

#: The verdict kinds of a job that waits forever; the others are desyncs (tracelab.hang.verdict).
_HANG_KINDS = ("not_entered", "missing_rank")

_FIX = {
    "not_entered": (
        "Rank(s) {absent} never issued {op} #{seq}, which rank(s) {entered} did: their code "
        "paths diverged before it (a condition on the rank or the data, an early exit or a "
        "caught exception, a rank that ran out of batches). Every rank must issue the same "
        "collectives in the same order; start at the stack shown and at rank(s) {absent}'s "
        "last op. `tracelab hang` on the dumps prints each rank's last ops."
    ),
    "missing_rank": (
        "Rank(s) {absent} left no dump: the process died or was killed (a crash, an OOM kill, "
        "a signal) while rank(s) {entered} waited in {op} #{seq}. Read rank(s) {absent}'s log "
        "and exit status for the error; the collective's timeout only reports the wait."
    ),
    "op_mismatch": (
        "The ranks issued different collectives at #{seq} of process group {pg}: their code "
        "paths diverged before it. Every rank must issue the same collectives in the same "
        "order; compare the ranks' stacks and last ops (`tracelab hang` on the dumps)."
    ),
    "size_mismatch": (
        "The ranks passed tensors of different sizes to {op} #{seq} ({sizes}): every rank must "
        "pass the same shapes to a collective. Look for a per-rank shape (an uneven last "
        "batch, padding, a rank-dependent split) at the stack shown."
    ),
    "dtype_mismatch": (
        "The ranks passed tensors of different dtypes to {op} #{seq} ({sizes}): every rank "
        "must pass the same dtypes (mixed precision enabled on some ranks only, a cast on one "
        "code path)."
    ),
}


#: The step of the hang: the last step in which the diverging collective (its group and
#: sequence number) was recorded on any rank, else the run's last step. A hung job's traces end
#: in that step; the steady step that findings without a time show is long before it.
_HANG_STEP_SQL = """
    SELECT coalesce(
        (SELECT max(step) FROM collectives
         WHERE run_id = $run AND pg_name = $pg AND seq = $seq AND step IS NOT NULL
           AND list_contains($p2p_ops, op) = $p2p),
        (SELECT max(step) FROM job_steps WHERE run_id = $run))
"""


def hang_step(con: duckdb.DuckDBPyConnection, run_id: int, v: Mapping[str, Any]) -> int | None:
    """The step that shows the verdict `v` (_HANG_STEP_SQL); None when the run has no steps."""
    row = con.execute(
        _HANG_STEP_SQL,
        {
            "run": run_id,
            "pg": v["process_group"],
            "seq": v["seq"],
            "p2p": bool(v["p2p"]),
            "p2p_ops": list(P2P_OPS),
        },
    ).fetchone()
    return None if row is None or row[0] is None else int(row[0])


def _ranks(keys: Any) -> list[int]:
    return sorted(int(r) for r in keys)


def _listed(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks)) or "none"


def rank_rows(verdict: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per rank of the verdict's group: what it enqueued at the verdict's number (or its last
    op, or no dump), and where (the first frame outside PyTorch, when the dump has stacks)."""
    out = []
    for role, side in (("entered", verdict["entered"]), ("absent", verdict["absent"])):
        for key, e in sorted(side.items(), key=lambda kv: int(kv[0])):
            out.append(
                {
                    "rank": int(key),
                    "role": role,
                    "op": entry_text(e),
                    "where": (e.get("stack") or [None])[0] if e else None,
                }
            )
    return out


def _finding(v: Mapping[str, Any], step: int | None) -> Finding:
    entered = _ranks(v["entered"])
    # (a rank without a dump was listed among those that never entered)
    behind, no_dump = absent_ranks(v)
    entries = sorted(v["entered"].items(), key=lambda kv: int(kv[0]))
    sizes = "; ".join(f"rank {r}: {shape_text(e)}" for r, e in entries)
    hung = v["kind"] in _HANG_KINDS
    numbers: dict[str, float | int | str | None] = {
        "collective": v["op"],
        "seq": v["seq"],
        "process_group": f"{v['process_group']} (ranks {_listed(_ranks(v['members']))})",
    }
    if behind:
        numbers["never_entered"] = _listed(behind)
        for r in rank_rows(v):
            if r["role"] == "absent" and r["rank"] in behind:
                numbers[f"rank_{r['rank']}_last_op"] = r["op"]
    if no_dump:
        numbers["left_no_dump"] = _listed(no_dump)
    numbers["entered"] = "; ".join(f"rank {r}: {entry_text(e)}" for r, e in entries)
    where = next((r for r in rank_rows(v) if r["where"]), None)
    if where is not None:
        numbers["stack"] = f"rank {where['rank']} in {where['where']}"
    culprits = no_dump if v["kind"] == "missing_rank" else behind
    fix = _FIX[v["kind"]].format(
        absent=_listed(culprits),
        entered=_listed(entered),
        op=v["op"],
        seq=v["seq"],
        pg=v["process_group"],
        sizes=sizes,
    )
    if no_dump and v["kind"] != "missing_rank":
        fix += (
            f" Rank(s) {_listed(no_dump)} left no dump (died, or were killed by the others' "
            "timeout): their logs say which."
        )
    return Finding(
        code=Code.HANG if hung else Code.COLLECTIVE_DESYNC,
        severity=Severity.CRITICAL,
        title=headline(v, label=False),
        evidence=Evidence(
            ranks=tuple(culprits) if hung else tuple(entered),
            affected_ranks=tuple(entered) if hung else (),
            steps=() if step is None else (step,),
            numbers=numbers,
        ),
        suggestion=fix,
        analyzer=NAME,
        view=VIEW,
    )


def analyze(con: duckdb.DuckDBPyConnection, ctx: RunContext, params: Mapping[str, Any]) -> Result:
    p = merge_params(NAME, DEFAULTS, params)
    stored = stored_verdicts(con, ctx.run_id)
    if not stored:
        return Result(analyzer=NAME, run=ctx.name, params=p, metrics={"hang": None})
    verdict = stored[0]
    notes = tuple(f"also (likely a consequence): {headline(v)}" for v in stored[1:])
    return Result(
        analyzer=NAME,
        run=ctx.name,
        params=p,
        metrics={
            "hang": verdict["kind"] in _HANG_KINDS,
            "kind": verdict["kind"],
            "collective": verdict["op"],
            "seq": verdict["seq"],
            "process_group": verdict["process_group"],
        },
        tables={
            "ranks": rank_rows(verdict),
            "divergences": [
                {
                    "ordinal": i,
                    "kind": v["kind"],
                    "process_group": v["process_group"],
                    "seq": v["seq"],
                    "op": v["op"],
                    "entered": _listed(_ranks(v["entered"])),
                    "absent": _listed(_ranks(v["absent"])),
                }
                for i, v in enumerate(stored)
            ],
        },
        findings=(_finding(verdict, hang_step(con, ctx.run_id, verdict)),),
        notes=notes,
    )
