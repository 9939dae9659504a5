"""Event classification: the one place that says what an event *is*.

Rules are data, checked in order; the first that matches wins. Ingest compiles them into a single
SQL CASE expression applied once per event, so analyzers read `events.category` and never
re-derive it. The rules cover old and new NCCL kernel names (`ncclKernel_*`, `ncclDevKernel_*`),
ROCm (RCCL keeps NCCL's names; HIP runtime calls), Ascend HCCL, gloo and c10d host ops.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Category(str, enum.Enum):
    """What an event does, as the breakdowns count it."""

    COMPUTE = "compute"
    COMMUNICATION = "communication"
    MEMCPY = "memcpy"
    MEMSET = "memset"
    SYNC = "sync"
    RUNTIME = "runtime"
    CPU_OP = "cpu_op"
    ANNOTATION = "annotation"
    PYTHON = "python"
    OTHER = "other"


#: Kineto categories of events that run on the device.
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation", "cuda_sync", "mtia_ccp_events")

#: Kernel names of collective communication libraries (case-insensitive regex).
COMM_KERNEL_RE = r"^(nccl|rccl|hccl|msccl|c10d::)|nccl(Dev)?Kernel"
#: Host-side communication ops: gloo annotations, c10d ops, NCCL annotations, functional collectives.
COMM_HOST_RE = (
    r"^(gloo:|nccl:|c10d::|_c10d_functional::(all_reduce|all_gather|reduce_scatter|broadcast|"
    r"all_to_all|wait_tensor)|record_param_comms$)"
)
#: Runtime calls that block the host on the device.
SYNC_RUNTIME_RE = r"(Synchronize|StreamWaitEvent|EventQuery)"


@dataclass(frozen=True, kw_only=True)
class Rule:
    """Match on Kineto `cat` (exact, any of) and/or `name` (regex); assign a category."""

    category: Category
    cats: tuple[str, ...] = ()
    name_re: str | None = None


RULES: tuple[Rule, ...] = (
    Rule(category=Category.COMMUNICATION, cats=("kernel",), name_re=COMM_KERNEL_RE),
    Rule(category=Category.COMPUTE, cats=("kernel",)),
    Rule(category=Category.MEMCPY, cats=("gpu_memcpy",)),
    Rule(category=Category.MEMSET, cats=("gpu_memset",)),
    Rule(category=Category.SYNC, cats=("cuda_sync",)),
    Rule(category=Category.ANNOTATION, cats=("gpu_user_annotation",)),
    Rule(category=Category.SYNC, cats=("cuda_runtime", "cuda_driver"), name_re=SYNC_RUNTIME_RE),
    Rule(category=Category.RUNTIME, cats=("cuda_runtime", "cuda_driver")),
    Rule(category=Category.COMMUNICATION, cats=("cpu_op", "user_annotation"), name_re=COMM_HOST_RE),
    Rule(category=Category.CPU_OP, cats=("cpu_op",)),
    Rule(category=Category.ANNOTATION, cats=("user_annotation",)),
    Rule(category=Category.PYTHON, cats=("python_function",)),
)


def category_sql(cat_col: str = "cat", name_col: str = "name") -> tuple[str, list[str]]:
    """A SQL CASE expression for the rules, and its bind parameters in order."""
    parts: list[str] = []
    params: list[str] = []
    for rule in RULES:
        conds: list[str] = []
        if rule.cats:
            conds.append(f"{cat_col} IN ({', '.join('?' for _ in rule.cats)})")
            params.extend(rule.cats)
        if rule.name_re is not None:
            conds.append(f"regexp_matches({name_col}, ?, 'i')")
            params.append(rule.name_re)
        parts.append(f"WHEN {' AND '.join(conds)} THEN ?")
        params.append(rule.category.value)
    return f"CASE {' '.join(parts)} ELSE ? END", [*params, Category.OTHER.value]


def on_device_sql(cat_col: str = "cat") -> tuple[str, list[str]]:
    """SQL for events.on_device, and its parameters."""
    return f"({cat_col} IN ({', '.join('?' for _ in DEVICE_CATS)}))", list(DEVICE_CATS)


def classify(cat: str | None, name: str) -> Category:
    """The same rules in Python, for the collector and for tests."""
    import re

    for rule in RULES:
        if rule.cats and cat not in rule.cats:
            continue
        if rule.name_re is not None and not re.search(rule.name_re, name, re.IGNORECASE):
            continue
        return rule.category
    return Category.OTHER
