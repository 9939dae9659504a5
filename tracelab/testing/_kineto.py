"""One rank's Kineto trace, built event by event, written the way torch.profiler writes it.

Times given to the builder are integer nanoseconds on the *true* clock, relative to the run's
origin; the builder adds the rank's clock offset (local = true + offset) and writes `ts`/`dur` in
microseconds relative to `baseTimeNanoseconds`, as Kineto does.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

#: baseTimeNanoseconds of every synthetic trace (wall clock floored, identical across ranks).
BASE_TIME_NS = 1_733_097_600_000_000_000
#: True-clock origin of a synthetic run, relative to the base (1 s in).
ORIGIN_NS = 1_000_000_000
MS = 1_000_000
US = 1_000

#: Bytes per element of the NCCL dtype names Kineto writes.
DTYPE_BYTES = {"Float": 4, "float": 4, "BFloat16": 2, "bf16": 2, "Half": 2, "Double": 8, "Int": 4}
#: Collective names as NCCL kernels spell them (legacy and ncclDev styles).
NCCL_NAMES = {
    "all_reduce": ("AllReduce", "allreduce"),
    "all_gather": ("AllGather", "allgather"),
    "reduce_scatter": ("ReduceScatter", "reduce_scatter"),
    "broadcast": ("Broadcast", "broadcast"),
    "all_to_all": ("SendRecv", "all_to_all"),
    "send": ("SendRecv", "send"),
    "recv": ("SendRecv", "recv"),
}
#: gloo annotation and c10d op per collective kind.
GLOO_NAMES = {
    "all_reduce": ("gloo:all_reduce", "c10d::allreduce_"),
    "all_gather": ("gloo:all_gather", "c10d::_allgather_base_"),
    "reduce_scatter": ("gloo:reduce_scatter", "c10d::_reduce_scatter_base_"),
    "broadcast": ("gloo:broadcast", "c10d::broadcast_"),
    "send": ("gloo:send", "c10d::send"),
    "recv": ("gloo:recv", "c10d::recv_"),
}


class RankTrace:
    """Builder for one rank's trace. Every add-method returns the builder's event dict."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        *,
        backend: str = "nccl",
        device: str | None = "NVIDIA H100 80GB HBM3",
        device_memory_bytes: int | None = 80 * 1024**3,
        clock_offset_ns: int = 0,
        pg_ranks: list[int] | None = None,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.device = device
        self.device_memory_bytes = device_memory_bytes
        self.clock_offset_ns = clock_offset_ns
        self.pid = 100_000 + rank
        self.main_tid = self.pid
        self.comm_tid = self.pid + 1
        self.gpu = rank % 8
        ranks = list(range(world_size)) if pg_ranks is None else pg_ranks
        self.pg_config = [
            {
                "pg_name": "0",
                "pg_desc": "default_pg",
                "backend_config": f"cpu:{backend}",
                "pg_size": len(ranks),
                "ranks": ranks,
            }
        ]
        self.events: list[dict[str, Any]] = []
        self.steps: list[tuple[int, int, int]] = []
        #: The collector's view of each collective (collectives.jsonl rows, local clock).
        self.collectives: list[dict[str, Any]] = []
        self._seq: dict[str, int] = {}
        self._ext = 1
        self._corr = 1

    # -- low level -------------------------------------------------------------------------
    def _ts(self, t_ns: int) -> float:
        return round((ORIGIN_NS + t_ns + self.clock_offset_ns) / 1000.0, 3)

    def x(
        self,
        cat: str,
        name: str,
        start_ns: int,
        end_ns: int,
        *,
        pid: int,
        tid: int,
        args: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A complete ('X') event."""
        if end_ns < start_ns:
            raise ValueError(f"{name}: end {end_ns} before start {start_ns}")
        ev = {
            "ph": "X",
            "cat": cat,
            "name": name,
            "pid": pid,
            "tid": tid,
            "ts": self._ts(start_ns),
            "dur": round((end_ns - start_ns) / 1000.0, 3),
            "args": dict(args or {}),
        }
        self.events.append(ev)
        return ev

    def _next_ext(self) -> int:
        self._ext += 1
        return self._ext

    # -- host ------------------------------------------------------------------------------
    def step(self, n: int, start_ns: int, end_ns: int) -> dict[str, Any]:
        """The ProfilerStep#n annotation on the main thread."""
        self.steps.append((n, start_ns, end_ns))
        return self.x(
            "user_annotation",
            f"ProfilerStep#{n}",
            start_ns,
            end_ns,
            pid=self.pid,
            tid=self.main_tid,
            args={"External id": self._next_ext()},
        )

    def annotation(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        *,
        tid: int | None = None,
        args: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A record_function span (user_annotation) on a host thread."""
        return self._host_span("user_annotation", name, start_ns, end_ns, tid, args)

    def cpu_op(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        *,
        tid: int | None = None,
        args: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """An aten/c10d operator on a host thread."""
        return self._host_span("cpu_op", name, start_ns, end_ns, tid, args)

    def _host_span(
        self,
        cat: str,
        name: str,
        start_ns: int,
        end_ns: int,
        tid: int | None,
        args: dict[str, Any] | None,
    ) -> dict[str, Any]:
        return self.x(
            cat,
            name,
            start_ns,
            end_ns,
            pid=self.pid,
            tid=self.main_tid if tid is None else tid,
            args={"External id": self._next_ext(), **(args or {})},
        )

    def memory(
        self, t_ns: int, *, allocated: int, reserved: int, delta: int, device_type: int = 1
    ) -> dict[str, Any]:
        """A `[memory]` instant (profile_memory=True) after an allocation or free."""
        ev = {
            "ph": "i",
            "cat": "cpu_instant_event",
            "s": "t",
            "name": "[memory]",
            "pid": self.pid,
            "tid": self.main_tid,
            "ts": self._ts(t_ns),
            "args": {
                "Total Reserved": reserved,
                "Total Allocated": allocated,
                "Bytes": delta,
                "Addr": 140_000_000_000 + len(self.events),
                "Device Id": self.gpu if device_type == 1 else -1,
                "Device Type": device_type,
            },
        }
        self.events.append(ev)
        return ev

    def step_of(self, t_ns: int) -> int | None:
        """The step whose host span holds true time `t_ns`."""
        for n, s0, s1 in self.steps:
            if s0 <= t_ns < s1:
                return n
        return None

    def _record(
        self,
        op: str,
        start_ns: int,
        end_ns: int,
        *,
        nbytes: int,
        dtype: str,
        ranks: list[int],
        pg_name: str = "0",
        peer: int | None = None,
        seq: int | None = None,
    ) -> int:
        key = pg_name if op not in ("send", "recv") else f"{pg_name}/p2p"
        if seq is None:
            seq = self._seq.get(key, 0)
            self._seq[key] = seq + 1
        self.collectives.append(
            {
                "op": op,
                "source": "collector",
                "pg_name": pg_name,
                "pg_desc": "default_pg",
                "pg_ranks": ranks,
                "group_size": len(ranks),
                "seq": seq,
                "in_bytes": nbytes,
                "out_bytes": nbytes,
                "dtype": dtype,
                "peer": peer,
                "enqueue_ns": self.abs_ns(start_ns),
                "start_ns": self.abs_ns(start_ns),
                "end_ns": self.abs_ns(end_ns),
                "step": self.step_of(start_ns),
            }
        )
        return seq

    # -- device ----------------------------------------------------------------------------
    def _launch_time(self, start_ns: int, launch_ns: int | None) -> int:
        if launch_ns is not None:
            return launch_ns
        for _, s0, s1 in self.steps:
            if s0 <= start_ns < s1:
                return max(s0, start_ns - 2 * US)
        return start_ns - 2 * US

    def device_event(
        self,
        cat: str,
        name: str,
        start_ns: int,
        end_ns: int,
        *,
        stream: int = 7,
        launch_ns: int | None = None,
        runtime: str = "cudaLaunchKernel",
        args: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Device work plus its host launch (cuda_runtime) and the ac2g flow linking them."""
        corr = self._corr = self._corr + 1
        ext = self._next_ext()
        launch = self._launch_time(start_ns, launch_ns)
        self.x(
            "cuda_runtime",
            runtime,
            launch,
            launch + 1 * US,
            pid=self.pid,
            tid=self.main_tid,
            args={"External id": ext, "cbid": 211, "correlation": corr},
        )
        self.events.append(
            {
                "ph": "s",
                "id": corr,
                "pid": self.pid,
                "tid": self.main_tid,
                "ts": self._ts(launch),
                "cat": "ac2g",
                "name": "ac2g",
            }
        )
        self.events.append(
            {
                "ph": "f",
                "id": corr,
                "pid": self.gpu,
                "tid": stream,
                "ts": self._ts(start_ns),
                "cat": "ac2g",
                "name": "ac2g",
                "bp": "e",
            }
        )
        base: dict[str, Any] = {
            "External id": ext,
            "queued": 0,
            "device": self.gpu,
            "context": 1,
            "stream": stream,
            "correlation": corr,
        }
        if cat == "kernel":
            base.update(
                {
                    "registers per thread": 64,
                    "shared memory": 0,
                    "grid": [108, 1, 1],
                    "block": [256, 1, 1],
                }
            )
        return self.x(
            cat, name, start_ns, end_ns, pid=self.gpu, tid=stream, args={**base, **(args or {})}
        )

    def kernel(
        self,
        name: str,
        start_ns: int,
        end_ns: int,
        *,
        stream: int = 7,
        launch_ns: int | None = None,
    ) -> dict[str, Any]:
        """A compute kernel."""
        return self.device_event(
            "kernel", name, start_ns, end_ns, stream=stream, launch_ns=launch_ns
        )

    def memcpy(
        self,
        start_ns: int,
        end_ns: int,
        *,
        kind: str = "HtoD",
        stream: int = 7,
        nbytes: int = 1 << 20,
    ) -> dict[str, Any]:
        """A gpu_memcpy (e.g. 'Memcpy HtoD (Pageable -> Device)')."""
        src, dst = {
            "HtoD": ("Pageable", "Device"),
            "DtoH": ("Device", "Pageable"),
            "DtoD": ("Device", "Device"),
        }[kind]
        return self.device_event(
            "gpu_memcpy",
            f"Memcpy {kind} ({src} -> {dst})",
            start_ns,
            end_ns,
            stream=stream,
            runtime="cudaMemcpyAsync",
            args={"bytes": nbytes, "memory bandwidth (GB/s)": 1.0},
        )

    def nccl(
        self,
        op: str,
        start_ns: int,
        end_ns: int,
        *,
        nbytes: int,
        dtype: str = "Float",
        group_ranks: list[int] | None = None,
        pg_name: str = "0",
        pg_desc: str = "default_pg",
        style: str = "legacy",
        stream: int = 20,
        launch_ns: int | None = None,
        seq: int | None = None,
    ) -> dict[str, Any]:
        """An NCCL kernel carrying the comm args; style 'legacy' (ncclKernel_*) or 'dev'."""
        ranks = list(range(self.world_size)) if group_ranks is None else group_ranks
        camel, coll = NCCL_NAMES[op]
        short = {"Float": "float", "BFloat16": "bf16", "Half": "half"}.get(dtype, dtype.lower())
        if style == "legacy":
            name = f"ncclKernel_{camel}_RING_LL_Sum_{short}(ncclDevComm*, unsigned long, ncclWork*)"
        else:
            name = f"ncclDevKernel_{camel}_Sum_{short}_RING_LL"
            if camel == "SendRecv":
                name = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
        nelems = nbytes // DTYPE_BYTES.get(dtype, 1)
        args: dict[str, Any] = {
            "Collective name": coll,
            "In msg nelems": nelems,
            "Out msg nelems": nelems,
            "Group size": len(ranks),
            "dtype": dtype,
            "In split size": "[]",
            "Out split size": "[]",
            "Process Group Name": pg_name,
            "Process Group Description": pg_desc,
            "Process Group Ranks": str(ranks),
        }
        self._record(
            op, start_ns, end_ns, nbytes=nbytes, dtype=dtype, ranks=ranks, pg_name=pg_name, seq=seq
        )
        if seq is not None:
            args["Seq"] = seq
        return self.device_event(
            "kernel", name, start_ns, end_ns, stream=stream, launch_ns=launch_ns, args=args
        )

    def gloo(
        self,
        op: str,
        start_ns: int,
        end_ns: int,
        *,
        nbytes: int = 4096,
        peer: int | None = None,
        blocking: bool = True,
    ) -> dict[str, Any]:
        """A gloo collective as PyTorch profiles it on CPU: the c10d op on the main thread (the
        whole wait when `blocking`) and the `gloo:*` annotation on the gloo worker thread."""
        ann, c10d = GLOO_NAMES[op]
        dims = [[nbytes // 4]]
        concrete: list[Any] = ["", "", "" if peer is None else str(peer)]
        host_end = end_ns if blocking else start_ns
        self._record(
            op,
            start_ns,
            end_ns,
            nbytes=nbytes,
            dtype="float32",
            ranks=list(range(self.world_size)),
            peer=peer,
        )
        self.cpu_op(
            c10d,
            start_ns,
            host_end,
            args={"Input Dims": dims, "Input type": ["float"], "Concrete Inputs": concrete},
        )
        # gloo runs collectives on its worker thread, send/recv on the calling thread.
        tid = self.main_tid if op in ("send", "recv") else self.comm_tid
        return self.annotation(ann, start_ns, end_ns, tid=tid)

    # -- output ----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        meta = [
            {
                "name": "process_name",
                "ph": "M",
                "ts": 0,
                "pid": self.pid,
                "tid": 0,
                "args": {"name": "python3"},
            },
            {
                "name": "thread_name",
                "ph": "M",
                "ts": 0,
                "pid": self.pid,
                "tid": self.main_tid,
                "args": {"name": "thread 1 (python3)"},
            },
            {
                "name": "thread_name",
                "ph": "M",
                "ts": 0,
                "pid": self.pid,
                "tid": self.comm_tid,
                "args": {"name": "thread 2 (gloo)"},
            },
        ]
        if self.device is not None and self.device != "cpu":
            meta.append(
                {
                    "name": "process_name",
                    "ph": "M",
                    "ts": 0,
                    "pid": self.gpu,
                    "tid": 0,
                    "args": {"name": "python3"},
                }
            )
            meta.append(
                {
                    "name": "process_labels",
                    "ph": "M",
                    "ts": 0,
                    "pid": self.gpu,
                    "tid": 0,
                    "args": {"labels": f"GPU {self.gpu}"},
                }
            )
        out: dict[str, Any] = {
            "schemaVersion": 1,
            "distributedInfo": {
                "backend": self.backend,
                "rank": self.rank,
                "world_size": self.world_size,
                "pg_count": 1,
                "pg_config": self.pg_config,
            },
            "traceEvents": meta + self.events,
            "traceName": f"synthetic_rank_{self.rank}.json",
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": BASE_TIME_NS,
        }
        if self.device is not None and self.device != "cpu":
            out["deviceProperties"] = [
                {
                    "id": self.gpu,
                    "name": self.device,
                    "totalGlobalMem": self.device_memory_bytes,
                    "computeMajor": 9,
                    "computeMinor": 0,
                    "numSms": 132,
                }
            ]
        return out

    def write(self, path: Path) -> Path:
        """Write as JSON, gzipped when the name ends in .gz."""
        data = json.dumps(self.to_dict()).encode()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(data, 1) if path.suffix == ".gz" else data)
        return path

    def abs_ns(self, t_ns: int) -> int:
        """The absolute ts_ns the store will hold for true time `t_ns` on this rank."""
        return BASE_TIME_NS + ORIGIN_NS + t_ns + self.clock_offset_ns
