"""Event classification: the one place that says what an event *is*.

Rules are data, checked in order; the first that matches wins. Ingest compiles them into a single
SQL CASE expression applied once per event, so analyzers read `events.category` and never
re-derive it. The rules cover old and new NCCL kernel names (`ncclKernel_*`, `ncclDevKernel_*`),
ROCm (RCCL keeps NCCL's names; HIP runtime calls), Ascend HCCL, gloo and c10d host ops, and MTIA.

Kineto categories are matched case-insensitively and through the aliases of older profilers
(PyTorch 1.8 wrote `Operator`, `Kernel`, `Memcpy`, `Memset`, `Runtime`, `Python`), as the
TensorBoard plugin's EventTypeMap does: `canonical_cat` gives the name the rules use.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracelab.vocabulary import Category

#: Kineto categories of events that run on the device (canonical names, see canonical_cat).
DEVICE_CATS = (
    "kernel",
    "gpu_memcpy",
    "gpu_memset",
    "gpu_user_annotation",
    "cuda_sync",
    "mtia_ccp_events",
)
#: Host-side runtime/driver categories of every device kind Kineto names (libkineto's
#: ActivityType.h; the TensorBoard plugin maps the same ones to its Runtime role).
RUNTIME_CATS = (
    "cuda_runtime",
    "cuda_driver",
    "mtia_runtime",
    "xpu_runtime",
    "xpu_driver",
    "privateuse1_runtime",
    "privateuse1_driver",
    "glow_runtime",
)
#: Older profilers' category names (lower-cased) -> the current Kineto name. PyTorch 1.8's
#: Kineto wrote `Operator`, `Kernel`, `Memcpy`, `Memset`, `Runtime`, `Python` (and the
#: TensorBoard plugin reads both spellings, torch_tb_profiler/profiler/trace.py EventTypeMap).
CAT_ALIASES = {
    "operator": "cpu_op",
    "runtime": "cuda_runtime",
    "memcpy": "gpu_memcpy",
    "memset": "gpu_memset",
    "python": "python_function",
}

#: Kernel names of collective communication libraries (case-insensitive regex).
COMM_KERNEL_RE = r"^(nccl|rccl|hccl|msccl|c10d::)|nccl(Dev)?Kernel"
#: Host-side communication ops: gloo annotations, c10d ops, NCCL annotations, functional collectives.
COMM_HOST_RE = (
    r"^(gloo:|nccl:|c10d::|_c10d_functional::(all_reduce|all_gather|reduce_scatter|broadcast|"
    r"all_to_all|wait_tensor)|record_param_comms$)"
)
#: record_function spans that PyTorch 1.8 wrote with the operators' category (`Operator`, i.e.
#: cpu_op): the profiler's step spans and the DataLoader/DataPipe iteration spans. They are
#: annotations, as in current traces (user_annotation), not operators (the TensorBoard plugin
#: gives them their own roles, ProfilerStep and DataLoader).
ANNOTATION_OP_RE = r"^(ProfilerStep#\d+$|enumerate\((DataLoader|DataPipe)\)#)"
#: Runtime calls that block the host on the device (MTIA: synchronize, synchronizeStream).
SYNC_RUNTIME_RE = r"(Synchronize|StreamWaitEvent|EventQuery)"
#: MTIA device events (`mtia_ccp_events`) as HTA reads them (hta/common/types.py): `dma*` moves
#: memory; `event_wait`/`event_record` are the device's own stream synchronization; the
#: execution containers HTA leaves out of compute (job, packet, PE and subgraph wrappers) are
#: not compute either, so that only the kernels inside them count.
MTIA_MEMORY_RE = r"^dma"
MTIA_SYNC_RE = r"^event_(wait|record)"
MTIA_CONTAINER_RE = (
    r"^(job_exe|packet|pe_exe|cpum_exe_subgraph|collective_subgraph_execution|"
    r"runFunction)"
)


@dataclass(frozen=True, kw_only=True)
class Rule:
    """Match on Kineto `cat` (exact, any of) and/or `name` (regex); assign a category."""

    category: Category
    cats: tuple[str, ...] = ()
    name_re: str | None = None


RULES: tuple[Rule, ...] = (
    Rule(category=Category.ANNOTATION, cats=("cpu_op",), name_re=ANNOTATION_OP_RE),
    Rule(
        category=Category.COMMUNICATION, cats=("kernel", "mtia_ccp_events"), name_re=COMM_KERNEL_RE
    ),
    Rule(category=Category.COMPUTE, cats=("kernel",)),
    Rule(category=Category.MEMCPY, cats=("mtia_ccp_events",), name_re=MTIA_MEMORY_RE),
    Rule(category=Category.SYNC, cats=("mtia_ccp_events",), name_re=MTIA_SYNC_RE),
    Rule(category=Category.OTHER, cats=("mtia_ccp_events",), name_re=MTIA_CONTAINER_RE),
    Rule(category=Category.COMPUTE, cats=("mtia_ccp_events",)),
    Rule(category=Category.MEMCPY, cats=("gpu_memcpy",)),
    Rule(category=Category.MEMSET, cats=("gpu_memset",)),
    Rule(category=Category.SYNC, cats=("cuda_sync",)),
    Rule(category=Category.ANNOTATION, cats=("gpu_user_annotation",)),
    Rule(category=Category.SYNC, cats=RUNTIME_CATS, name_re=SYNC_RUNTIME_RE),
    Rule(category=Category.RUNTIME, cats=RUNTIME_CATS),
    Rule(category=Category.COMMUNICATION, cats=("cpu_op", "user_annotation"), name_re=COMM_HOST_RE),
    Rule(category=Category.CPU_OP, cats=("cpu_op",)),
    Rule(category=Category.ANNOTATION, cats=("user_annotation",)),
    Rule(category=Category.PYTHON, cats=("python_function",)),
)


def canonical_cat(cat: str | None) -> str | None:
    """A trace's category as the rules name it: lower-cased, older names mapped to current ones
    (`Operator` -> `cpu_op`, `Kernel` -> `kernel`, `Runtime` -> `cuda_runtime`, ...)."""
    if cat is None:
        return None
    low = cat.lower()
    return CAT_ALIASES.get(low, low)


def on_device(cat: str | None) -> bool:
    """Whether an event of this Kineto category runs on the device."""
    return canonical_cat(cat) in DEVICE_CATS


def classify(cat: str | None, name: str) -> Category:
    """The same rules in Python, for the collector and for tests."""
    import re

    cat = canonical_cat(cat)
    for rule in RULES:
        if rule.cats and cat not in rule.cats:
            continue
        if rule.name_re is not None and not re.search(rule.name_re, name, re.IGNORECASE):
            continue
        return rule.category
    return Category.OTHER
