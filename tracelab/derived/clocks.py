"""Clock offsets: each rank's clock against the reference rank's, and how sure we are.

In order of precedence, per rank (docs/metrics.md, "Clocks"):
1. the collector's NTP-style clock exchange (the capture manifest), to microseconds;
2. ranks on the reference rank's host share its clock: offset 0, uncertainty the clock's
   resolution. The host comes from the capture, the trace's `host_name`, or the file name
   `tensorboard_trace_handler` writes (`<host>_<pid>.<ts>.pt.trace.json`);
3. otherwise the offset is estimated from matched collectives: the median difference of the
   matches' ends (a collective ends at nearly the same time on every rank), clamped into the
   bounds causality sets (no rank ends a collective before the reference rank arrived, and
   vice versa: start_r - end_ref <= offset_r <= end_r - start_ref for every match). Its
   uncertainty is the standard error of that median, 1.2533 * 1.4826 * MAD / sqrt(n) over the
   n matches: how far the estimate can be off, which shrinks as matches accumulate, not how
   long the collectives took. Ranks on one (other) host share one offset and pool their
   matches. Without a matched collective, nothing bounds it (method 'none').
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from tracelab.derived import sqlfiles
from tracelab.derived.collectives import keyed

#: Resolution of Kineto timestamps (µs with three decimals, from a µs-resolution clock).
CLOCK_RESOLUTION_NS = 1_000
#: File names as torch.profiler.tensorboard_trace_handler writes them: worker name (by default
#: `<host>_<pid>`), a millisecond timestamp, then `.pt.trace.json[.gz]`.
_HANDLER_NAME = re.compile(r"^(?P<host>.+)_(?P<pid>\d+)\.\d+\.pt\.trace\.json(\.gz)?$")


@dataclass(frozen=True, kw_only=True)
class RankClock:
    rank: int
    offset_ns: int
    uncertainty_ns: int | None
    method: str
    host: str | None
    matches: int


def host_from_file_name(name: str) -> str | None:
    """The host part of a tensorboard_trace_handler file name, else None."""
    m = _HANDLER_NAME.match(name.rsplit("/", 1)[-1])
    return m.group("host") if m else None


def _hosts(
    con: duckdb.DuckDBPyConnection, run_id: int
) -> list[tuple[int, str | None, int | None, int | None]]:
    """(rank, host, collector offset, collector uncertainty) per rank, in rank order."""
    rows = con.execute(
        """SELECT rank, host, clock_offset_ns, clock_uncertainty_ns,
                  json_extract_string(files, '$[0]') FROM ranks WHERE run_id = $run ORDER BY rank""",
        {"run": run_id},
    ).fetchall()
    return [
        (int(r), h or (host_from_file_name(f) if f else None), off, unc)
        for r, h, off, unc, f in rows
    ]


#: Standard error of a median of n normal samples: 1.2533 sigma / sqrt(n); sigma = 1.4826 MAD.
_SE_MEDIAN = 1.2533 * 1.4826


def _bounds(
    con: duckdb.DuckDBPyConnection,
    run_id: int,
    source: str,
    ref: int,
    ranks: list[tuple[int, str | None, int | None, int | None]],
) -> dict[str, tuple[int, int, float, float, int]]:
    """Per group of ranks sharing an offset (a host, else the rank alone): (lower bound, upper
    bound, median end difference, MAD of the end differences, matches) against `ref`."""
    groups = [[r, f"host:{h}" if h is not None else f"rank:{r}"] for r, h, _, _ in ranks]
    table = keyed(con, run_id, source)
    rows = con.execute(
        f"""
        WITH mt AS (FROM {table}),
        g AS (SELECT unnest($ranks::INTEGER[]) AS rank, unnest($groups::VARCHAR[]) AS grp),
        d AS (SELECT g.grp, x.start_ns - r.end_ns AS lo, x.end_ns - r.start_ns AS hi,
                     x.end_ns - r.end_ns AS diff
              FROM mt x JOIN mt r ON r.key = x.key AND r.rank = $ref AND x.rank <> $ref
              JOIN g ON g.rank = x.rank)
        SELECT grp, max(lo), min(hi), median(diff), mad(diff), count(*) FROM d GROUP BY grp
        """,
        {
            "ranks": [g[0] for g in groups],
            "groups": [g[1] for g in groups],
            "ref": ref,
        },
    ).fetchall()
    return {
        str(g): (int(lo), int(hi), float(med), float(mad), int(n))
        for g, lo, hi, med, mad, n in rows
    }


def estimate(con: duckdb.DuckDBPyConnection, run_id: int, source: str | None) -> list[RankClock]:
    """Every rank's clock, by the rules in the module docstring."""
    ranks = _hosts(con, run_id)
    if not ranks:
        return []
    ref, ref_host = ranks[0][0], ranks[0][1]
    bounds = _bounds(con, run_id, source, ref, ranks) if source is not None else {}
    out = []
    for rank, host, c_off, c_unc in ranks:
        group = f"host:{host}" if host is not None else f"rank:{rank}"
        if c_off is not None:
            out.append(
                RankClock(
                    rank=rank,
                    offset_ns=int(c_off),
                    host=host,
                    matches=0,
                    uncertainty_ns=int(c_unc or 0),
                    method="collector",
                )
            )
        elif rank == ref:
            out.append(
                RankClock(
                    rank=rank,
                    offset_ns=0,
                    uncertainty_ns=CLOCK_RESOLUTION_NS,
                    method="reference",
                    host=host,
                    matches=0,
                )
            )
        elif host is not None and host == ref_host:
            out.append(
                RankClock(
                    rank=rank,
                    offset_ns=0,
                    uncertainty_ns=CLOCK_RESOLUTION_NS,
                    method="same_host",
                    host=host,
                    matches=0,
                )
            )
        elif group in bounds:
            out.append(_from_bounds(rank, host, *bounds[group]))
        else:
            out.append(
                RankClock(
                    rank=rank, offset_ns=0, uncertainty_ns=None, method="none", host=host, matches=0
                )
            )
    return out


def _from_bounds(
    rank: int, host: str | None, lo: int, hi: int, med: float, mad: float, n: int
) -> RankClock:
    se = _SE_MEDIAN * mad / math.sqrt(n)
    if lo <= hi:
        est = int(round(min(max(med, lo), hi)))
    else:  # no offset satisfies every match: drift, or matches paired wrongly
        est = int(round(med))
    unc = max(int(math.ceil(se)), CLOCK_RESOLUTION_NS)
    return RankClock(
        rank=rank, offset_ns=est, uncertainty_ns=unc, method="collectives", host=host, matches=n
    )


def derive(con: duckdb.DuckDBPyConnection, run_id: int, source: str | None) -> None:
    """Fill clock_offsets for the run (tracelab/derived/sql/clock_offsets.sql)."""
    clocks = estimate(con, run_id, source)
    if not clocks:
        return
    table = pa.table(
        {
            "rank": pa.array([c.rank for c in clocks], pa.int32()),
            "offset_ns": pa.array([c.offset_ns for c in clocks], pa.int64()),
            "uncertainty_ns": pa.array([c.uncertainty_ns for c in clocks], pa.int64()),
            "method": pa.array([c.method for c in clocks], pa.string()),
            "reference_rank": pa.array([clocks[0].rank] * len(clocks), pa.int32()),
            "host": pa.array([c.host for c in clocks], pa.string()),
            "matches": pa.array([c.matches for c in clocks], pa.int32()),
        }
    )
    sqlfiles.run(con, "clock_offsets", {"run": run_id}, {"_tl_clocks": table})
