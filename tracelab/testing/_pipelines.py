"""Laying out pipeline-parallel traces from a replayed schedule (see synth.pipeline)."""

from __future__ import annotations

from typing import Any

from tracelab.derived.schedules import Action, Replay, make_order, replay
from tracelab.testing._kineto import MS, RankTrace

#: Kernel and host-op names per action kind.
KERNELS = {
    "F": "sm90_xmma_gemm_bf16_fprop",
    "B": "sm90_xmma_gemm_bf16_bprop",
    "I": "sm90_xmma_gemm_bf16_dgrad",
    "W": "sm90_xmma_gemm_bf16_wgrad",
}
HOST_OPS = {
    "F": "aten::linear",
    "B": "autograd::engine::evaluate_function: AddmmBackward0",
    "I": "autograd::engine::evaluate_function: AddmmBackward0",
    "W": "autograd::engine::evaluate_function: AccumulateGrad",
}


def _ns(x: float) -> int:
    return int(round(x * MS))


def _label(a: Action, annotate: str) -> str | None:
    stage, kind, mb = a
    if annotate == "pp":
        return f"PP:{stage}{kind}{mb}"
    if annotate == "gpipe":
        return f"{'Forward' if kind == 'F' else 'Backward'} {mb}"
    return None


def _peaks(order: dict[int, list[Action]], rp: Replay) -> dict[int, list[tuple[float, int]]]:
    """Per rank, (time, +1/-1) activation events: F allocates at its start, B/I frees at end."""
    out: dict[int, list[tuple[float, int]]] = {}
    for r, acts in order.items():
        evs = []
        for a in acts:
            s, e = rp.times[a]
            if a[1] == "F":
                evs.append((s, 1))
            elif a[1] in ("B", "I"):
                evs.append((e, -1))
        out[r] = sorted(evs, key=lambda x: (x[0], x[1]))
    return out


def pipeline_traces(
    *,
    schedule: str,
    p: int,
    m: int,
    v: int,
    tf_ms: float,
    tb_ms: float,
    backend: str,
    annotate: str,
    steps: int,
    slow_stage: int | None,
    slow_factor: float,
    stall_ms: float,
    act_bytes: int,
) -> tuple[list[RankTrace], dict[str, Any]]:
    order = make_order(schedule, p, m, v)

    def dur(a: Action) -> float:
        base = {"F": tf_ms, "B": tb_ms, "I": tf_ms, "W": tf_ms}[a[1]] / v
        return base * (slow_factor if slow_stage is not None and a[0] == slow_stage else 1.0)

    def delay(a: Action) -> float:
        return stall_ms if (a[0], a[1], a[2]) == (1 % (p * v), "F", 0) else 0.0

    ideal = replay(order, dur)
    rp = replay(order, dur, delay if stall_ms else None)
    gpu = backend != "gloo"
    traces = [
        RankTrace(r, p, backend=backend, device="NVIDIA H100 80GB HBM3" if gpu else None)
        for r in range(p)
    ]
    peaks = _peaks(order, rp)
    period = rp.makespan + 2.0
    for k in range(steps):
        o = k * period
        for t in traces:
            t.step(k + 1, _ns(o), _ns(o + rp.makespan))
            t.memory(_ns(o), allocated=0, reserved=0, delta=0, device_type=1 if gpu else 0)
            level = 0
            for when, d in peaks[t.rank]:
                level += d
                t.memory(
                    _ns(o + when),
                    allocated=level * act_bytes,
                    reserved=max(level, 1) * act_bytes,
                    delta=d * act_bytes,
                    device_type=1 if gpu else 0,
                )
            free = 0.0
            for a in order[t.rank]:
                s, e = rp.times[a]
                _emit(t, a, o, free, s, e, gpu=gpu, annotate=annotate, p=p * v)
                free = e
    peak_mb = {
        r: max((sum(d for _, d in peaks[r][: i + 1]) for i in range(len(peaks[r]))), default=0)
        for r in range(p)
    }
    mean_peak = sum(peak_mb.values()) / p
    idle = {r: rp.makespan - rp.busy[r] for r in range(p)}
    expected = {
        "schedule": schedule,
        "p": p,
        "m": m,
        "v": v,
        "makespan_ms": rp.makespan,
        "idle_ms": [idle[r] for r in range(p)],
        "bubble_share": [idle[r] / rp.makespan for r in range(p)],
        "bubble_share_megatron": [idle[r] / rp.busy[r] for r in range(p)],
        "leading_idle_ms": [rp.first_start[r] for r in range(p)],
        "trailing_idle_ms": [rp.makespan - rp.last_end[r] for r in range(p)],
        "inherent_idle_ms": [ideal.makespan - ideal.busy[r] for r in range(p)],
        "inherent_makespan_ms": ideal.makespan,
        "peak_microbatches": [peak_mb[r] for r in range(p)],
        "memory_max_over_mean": max(peak_mb.values()) / mean_peak if mean_peak else None,
        "steps": steps,
    }
    return traces, expected


def _emit(
    t: RankTrace,
    a: Action,
    o: float,
    free: float,
    s: float,
    e: float,
    *,
    gpu: bool,
    annotate: str,
    p: int,
) -> None:
    """One action: its wait (recv), its compute (kernel or host op), its label, its send."""
    stage, kind, mb = a
    s_ns, e_ns, free_ns = _ns(o + s), _ns(o + e), _ns(o + free)
    needs_recv = (kind == "F" and stage > 0) or (kind in ("B", "I") and stage < p - 1)
    label = _label(a, annotate)
    if gpu:
        if needs_recv and s_ns > free_ns:
            t.nccl("recv", free_ns, s_ns, nbytes=1 << 20, stream=20, launch_ns=free_ns)
        if label is not None:
            t.annotation(label, s_ns, e_ns)
        else:
            t.cpu_op(HOST_OPS[kind], s_ns, e_ns)
        t.kernel(KERNELS[kind], s_ns, e_ns, launch_ns=s_ns)
        return
    if label is not None:
        # The runtime schedules' PP: span includes the wait for the input (docs/metrics.md).
        t.annotation(label, free_ns, e_ns)
    if needs_recv:
        t.gloo("recv", free_ns, s_ns, nbytes=1 << 20, peer=stage - 1 if kind == "F" else stage + 1)
    t.cpu_op(HOST_OPS[kind], s_ns, e_ns)
    needs_send = (kind == "F" and stage < p - 1) or (kind in ("B", "I") and stage > 0)
    if needs_send:
        t.gloo("send", e_ns, e_ns, nbytes=1 << 20, peer=stage + 1 if kind == "F" else stage - 1)
