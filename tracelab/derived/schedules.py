"""Pipeline schedules: the order of actions each rank runs, and a replay of that order.

Used two ways: the pipeline analyzer replays the order it reconstructed from a trace with the
measured op times to get the *inherent* bubble (what the schedule alone costs, no stalls), and the
synthetic trace builder (tracelab.testing.synth) lays out constructed traces with known answers.

An action is (stage, kind, microbatch) with kind F (forward), B (full backward), I (input-grad
backward) or W (weight-grad backward). Dependencies (docs/metrics.md, "The lost-time model"): F(k, mb) after
F(k-1, mb); B/I(k, mb) after B/I(k+1, mb), the last stage after its own F(k, mb); W(k, mb) after
I(k, mb). Communication is free in the replay: that is what makes the result *inherent*.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

Action = tuple[int, str, int]
#: Per rank, the actions it runs, in order.
Order = dict[int, list[Action]]

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1")


def gpipe(p: int, m: int) -> Order:
    """ScheduleGPipe: all forwards, then all backwards, one stage per rank."""
    return {s: [(s, "F", i) for i in range(m)] + [(s, "B", i) for i in range(m)] for s in range(p)}


def one_f_one_b(p: int, m: int) -> Order:
    """Schedule1F1B as torch runs it: stage s does min(m, p - s) forwards, then B, F alternating."""
    order: Order = {}
    for s in range(p):
        warm = min(m, p - s)
        acts: list[Action] = [(s, "F", i) for i in range(warm)]
        f = warm
        for b in range(m):
            acts.append((s, "B", b))
            if f < m:
                acts.append((s, "F", f))
                f += 1
        order[s] = acts
    return order


def interleaved_1f1b(p: int, m: int, v: int) -> Order:
    """Megatron's interleaved 1F1B: rank r holds stages r, r+p, ..., r+(v-1)p; needs m % p == 0."""
    if m % p:
        raise ValueError(f"interleaved 1F1B needs microbatches ({m}) divisible by ranks ({p})")
    total = m * v

    def fwd(k: int) -> tuple[int, int]:
        chunk = (k // p) % v
        return chunk, (k // (p * v)) * p + k % p

    def bwd(k: int) -> tuple[int, int]:
        chunk, mb = fwd(k)
        return v - 1 - chunk, mb

    order: Order = {}
    for r in range(p):
        warm = min(total, (p - r - 1) * 2 + (v - 1) * p)
        acts: list[Action] = []
        for k in range(warm):
            c, mb = fwd(k)
            acts.append((r + c * p, "F", mb))
        for i in range(total - warm):
            c, mb = fwd(warm + i)
            acts.append((r + c * p, "F", mb))
            c, mb = bwd(i)
            acts.append((r + c * p, "B", mb))
        for i in range(total - warm, total):
            c, mb = bwd(i)
            acts.append((r + c * p, "B", mb))
        order[r] = acts
    return order


def zb_h1(p: int, m: int) -> Order:
    """ZB-H1 (Qi et al., 2023): 1F1B's memory limit, backward split into I and W, W deferred.

    Built greedily with unit op times: each stage runs an I when one is ready, else an F when one
    is ready and fewer than p - s microbatches are in flight, else a pending W.
    """
    order: Order = {s: [] for s in range(p)}
    done_f: dict[tuple[int, int], int] = {}
    done_i: dict[tuple[int, int], int] = {}
    nf = [0] * p
    ni = [0] * p
    nw = [0] * p
    free = [0] * p
    t = 0
    while any(nw[s] < m for s in range(p)):
        for s in range(p):
            if free[s] > t:
                continue
            act: Action | None = None
            if ni[s] < m and nf[s] > ni[s]:
                mb = ni[s]
                dep = done_f.get((s, mb)) if s == p - 1 else done_i.get((s + 1, mb))
                if dep is not None and dep <= t:
                    act = (s, "I", mb)
            if act is None and nf[s] < m and nf[s] - ni[s] < p - s:
                mb = nf[s]
                dep = 0 if s == 0 else done_f.get((s - 1, mb))
                if dep is not None and dep <= t:
                    act = (s, "F", mb)
            if act is None and nw[s] < ni[s]:
                act = (s, "W", nw[s])
            if act is None:
                continue
            _, kind, mb = act
            order[s].append(act)
            free[s] = t + 1
            if kind == "F":
                done_f[(s, mb)] = t + 1
                nf[s] += 1
            elif kind == "I":
                done_i[(s, mb)] = t + 1
                ni[s] += 1
            else:
                nw[s] += 1
        t += 1
    return order


def make_order(schedule: str, p: int, m: int, v: int = 1) -> Order:
    """The order of a named schedule (one of SCHEDULES)."""
    if schedule == "gpipe":
        return gpipe(p, m)
    if schedule == "1f1b":
        return one_f_one_b(p, m)
    if schedule == "interleaved_1f1b":
        return interleaved_1f1b(p, m, v)
    if schedule == "zb_h1":
        return zb_h1(p, m)
    raise ValueError(f"unknown schedule {schedule!r}; known: {', '.join(SCHEDULES)}")


@dataclass(frozen=True, kw_only=True)
class Replay:
    """Start and end of every action, the makespan, and per-rank busy time."""

    times: dict[Action, tuple[float, float]]
    makespan: float
    busy: dict[int, float]
    first_start: dict[int, float]
    last_end: dict[int, float]

    def idle(self, rank: int) -> float:
        return self.makespan - self.busy[rank]


def replay(
    order: Mapping[int, Sequence[Action]],
    dur: Callable[[Action], float],
    delay: Callable[[Action], float] | None = None,
) -> Replay:
    """Run each rank's actions in order as soon as their dependencies allow (free comm).

    `delay` adds idle time before an action (a stall), for constructed traces."""
    stages = {a[0] for acts in order.values() for a in acts}
    last_stage = max(stages) if stages else 0
    kinds: dict[tuple[int, int], set[str]] = {
        (a[0], a[2]): set() for acts in order.values() for a in acts
    }
    for acts in order.values():
        for s, k, mb in acts:
            kinds[(s, mb)].add(k)
    end: dict[Action, float] = {}
    times: dict[Action, tuple[float, float]] = {}
    pos = {r: 0 for r in order}
    free = {r: 0.0 for r in order}

    def dep_of(a: Action) -> Action | None:
        s, k, mb = a
        if k == "F":
            return (s - 1, "F", mb) if s > 0 and (s - 1) in stages else None
        if k in ("B", "I"):
            if s == last_stage:
                return (s, "F", mb)
            nxt = kinds.get((s + 1, mb), set())
            return (s + 1, "I" if "I" in nxt else "B", mb)
        return (s, "I", mb)

    remaining = sum(len(a) for a in order.values())
    while remaining:
        progressed = False
        for r, acts in order.items():
            while pos[r] < len(acts):
                a = acts[pos[r]]
                d = dep_of(a)
                if d is not None and d not in end:
                    break
                start = max(free[r], end[d] if d is not None else 0.0)
                if delay is not None:
                    start += delay(a)
                finish = start + dur(a)
                times[a] = (start, finish)
                end[a] = finish
                free[r] = finish
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: acts[pos[r]] for r, acts in order.items() if pos[r] < len(acts)}
            raise ValueError(f"schedule deadlocks: next actions {stuck} wait on each other")
    busy = {r: sum(times[a][1] - times[a][0] for a in acts) for r, acts in order.items()}
    first = {r: min((times[a][0] for a in acts), default=0.0) for r, acts in order.items()}
    last = {r: max((times[a][1] for a in acts), default=0.0) for r, acts in order.items()}
    t0 = min(first.values(), default=0.0)
    makespan = max(last.values(), default=0.0) - t0
    return Replay(times=times, makespan=makespan, busy=busy, first_start=first, last_end=last)


def bubble_formula(schedule: str, p: int, m: int, v: int = 1) -> tuple[float, float]:
    """Textbook bubble of a uniform pipeline: (share of the step, share of ideal compute)."""
    if schedule == "zb_h1":
        mega = (p - 1) / (3 * m)
    elif schedule == "interleaved_1f1b":
        mega = (p - 1) / (v * m)
    else:
        mega = (p - 1) / m
    return mega / (1 + mega), mega
