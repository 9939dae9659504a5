"""tracelab's vocabulary: the names every layer uses, defined once.

The lost-time parts with their labels and colours, event categories, collective and
point-to-point ops with the rules that name them, dtype sizes, the sources of collective timing,
and the finding codes in root-cause order. The ingest, the derived layer, the analyzers, the
views, the reports and the app read them from here; none spells them out again. This module
imports nothing of tracelab.
"""

from __future__ import annotations

import enum
import re

# --- The lost-time model (docs/metrics.md, "The lost-time parts") ---------------------------

#: The parts of a step in step_parts, in the order they are shown and stacked. They tile the
#: step: compute, exposed communication, exposed memcpy, waiting for other ranks, the pipeline
#: bubble the schedule needs, the stall beyond it, the host, and device idle in a sync.
STEP_PARTS = ("compute", "transfer", "memcpy", "wait", "bubble", "stall", "host", "idle")
#: The parts of time_parts' segments: step_parts' with bubble and stall still one `pipeline`
#: (step_parts splits it against the rank's inherent idle).
TIME_PARTS = ("compute", "transfer", "memcpy", "wait", "pipeline", "host", "idle")
#: What each part means, in words a performance engineer reads at a glance.
PART_LABELS = {
    "compute": "compute",
    "transfer": "communication (exposed)",
    "memcpy": "memcpy / memset (exposed)",
    "wait": "waiting for other ranks",
    "pipeline": "pipeline wait / bubble",
    "bubble": "pipeline bubble (schedule)",
    "stall": "pipeline stall",
    "host": "host (Python, data, launches)",
    "idle": "device idle (sync)",
}
#: Short labels where space is tight (the pipeline view's per-rank chart and table).
PART_SHORT_LABELS = {
    **PART_LABELS,
    "memcpy": "memcpy (exposed)",
    "bubble": "bubble (the schedule needs it)",
    "stall": "stall (waiting beyond the schedule)",
}
#: One word per part, for a rank's label ("rank 7 · +35% host").
PART_WORDS = {
    "compute": "compute",
    "transfer": "comm",
    "memcpy": "memcpy",
    "wait": "waiting",
    "pipeline": "pipeline",
    "bubble": "bubble",
    "stall": "stall",
    "host": "host",
    "idle": "idle",
}
#: One colour per part, shared by the Overview, the Timeline and the Pipeline view.
PART_COLORS = {
    "compute": "#4C78A8",
    "transfer": "#F58518",
    "memcpy": "#54A24B",
    "wait": "#E45756",
    "pipeline": "#B279A2",
    "bubble": "#D4B7D0",
    "stall": "#B279A2",
    "host": "#EECA3B",
    "idle": "#C9C9C9",
}


# --- Events -----------------------------------------------------------------------------------


class Category(str, enum.Enum):
    """What an event does, as the breakdowns count it (events.category; the rules that assign
    it are tracelab.ingest.classify's)."""

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


# --- Collectives --------------------------------------------------------------------------------

#: (regex on the lower-cased collective name with '_' removed, normalized op), first match wins.
OP_RULES = (
    (r"reducescatter", "reduce_scatter"),
    (r"allreduce", "all_reduce"),
    (r"allgather", "all_gather"),
    (r"alltoall", "all_to_all"),
    (r"sendrecv", "send_recv"),
    (r"broadcast", "broadcast"),
    (r"barrier", "barrier"),
    (r"^(c10d::)?reduce|reduce$", "reduce"),
    (r"gather", "gather"),
    (r"scatter", "scatter"),
    (r"send", "send"),
    (r"recv", "recv"),
)
#: Ops that pair two ranks rather than a group.
P2P_OPS = ("send", "recv", "send_recv")


def collective_op(name: str) -> str | None:
    """A collective's normalized op from its name by OP_RULES, as the SQL macro collective_op
    reads it ('gloo:all_to_all' -> 'all_to_all'); None when no rule matches."""
    key = name.lower().replace("_", "")
    return next((op for pattern, op in OP_RULES if re.search(pattern, key)), None)


#: Where a collective's timing comes from, in order of preference on a tie (docs/metrics.md,
#: "Matched collectives").
SOURCES = ("collector", "kernel", "host", "flight_recorder")
#: Bytes per element for the dtype names traces use (record_param_comms, gloo Input type).
DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "half": 2,
    "float16": 2,
    "bfloat16": 2,
    "double": 8,
    "float64": 8,
    "int": 4,
    "int32": 4,
    "long": 8,
    "int64": 8,
    "short": 2,
    "int16": 2,
    "char": 1,
    "int8": 1,
    "byte": 1,
    "uint8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "complexfloat": 8,
    "complexdouble": 16,
}


# --- Parallel dimensions (docs/metrics.md, "Process groups and parallel dimensions") ---------


class Dim(str, enum.Enum):
    """The parallel dimension a process group serves (process_groups.dim)."""

    #: Data parallel, replicated (DDP, FSDP's replicate dimension): gradient all-reduces.
    DP = "dp"
    #: Data parallel, sharded (FSDP / ZeRO-3): parameter all-gathers, gradient reduce-scatters.
    DP_SHARD = "dp_shard"
    #: Tensor parallel: activation all-reduces inside each layer's forward and backward.
    TP = "tp"
    #: Pipeline parallel: send/recv between stages.
    PP = "pp"
    #: Context parallel: all-to-all or ring exchange of sequence shards.
    CP = "cp"
    #: Expert parallel: all-to-all dispatch and combine.
    EP = "ep"
    #: Nothing says which.
    UNKNOWN = "unknown"


#: DeviceMesh and process-group names folded into one dimension (torchtitan's names, and the
#: `mesh_<name>` descriptions DeviceMesh gives its groups).
DIM_ALIASES = {
    "dp": Dim.DP,
    "ddp": Dim.DP,
    "dp_replicate": Dim.DP,
    "replicate": Dim.DP,
    "dp_shard": Dim.DP_SHARD,
    "fsdp": Dim.DP_SHARD,
    "shard": Dim.DP_SHARD,
    "dp_shard_cp": Dim.DP_SHARD,
    "dp_cp": Dim.DP,
    "tp": Dim.TP,
    "pp": Dim.PP,
    "cp": Dim.CP,
    "ep": Dim.EP,
}
#: What each dimension is called where space allows.
DIM_LABELS = {
    Dim.DP: "data parallel (dp)",
    Dim.DP_SHARD: "FSDP (dp_shard)",
    Dim.TP: "tensor parallel (tp)",
    Dim.PP: "pipeline (pp)",
    Dim.CP: "context parallel (cp)",
    Dim.EP: "expert parallel (ep)",
    Dim.UNKNOWN: "unknown group",
}
#: Where a group's dimension came from (process_groups.source), strongest first.
DIM_SOURCES = ("mesh", "collector", "trace", "inferred")


# --- Findings -----------------------------------------------------------------------------------


class Code:
    """Finding codes (stable: JSON, JUnit and the report's gates name them)."""

    #: The job hung: ranks never entered a collective, or one died (Flight Recorder dumps).
    HANG = "HANG"
    #: The ranks enqueued different ops, sizes or dtypes at one collective (Flight Recorder).
    COLLECTIVE_DESYNC = "COLLECTIVE_DESYNC"
    #: Uneven all-to-all splits: the rank that sends or receives the most (the heavy embedding
    #: tables, the popular experts) does the most work, and the others wait for it.
    ALL_TO_ALL_IMBALANCE = "ALL_TO_ALL_IMBALANCE"
    #: Even all-to-all splits and one late rank: a slow participant (its straggler finding
    #: says compute, host or communication).
    ALL_TO_ALL_SLOW_RANK = "ALL_TO_ALL_SLOW_RANK"
    #: A rank whose extra compute makes the others wait.
    STRAGGLER_COMPUTE = "STRAGGLER_COMPUTE"
    #: A rank whose host (Python, data loading, a sleep) makes the others wait.
    STRAGGLER_HOST = "STRAGGLER_HOST"
    #: A rank whose slow communication makes the others wait.
    STRAGGLER_COMM = "STRAGGLER_COMM"
    #: Pipeline stages with unequal work.
    PIPELINE_STAGE_IMBALANCE = "PIPELINE_STAGE_IMBALANCE"
    #: The bubble the pipeline schedule needs.
    PIPELINE_BUBBLE = "PIPELINE_BUBBLE"
    #: Pipeline waiting beyond what the schedule needs.
    PIPELINE_STALL = "PIPELINE_STALL"
    #: The device waits on the host.
    HOST_BOUND = "HOST_BOUND"
    #: Ranks wait for each other with no one rank to blame.
    SYNC_WAIT = "SYNC_WAIT"
    #: Communication that compute does not hide.
    EXPOSED_COMM = "EXPOSED_COMM"
    #: Steps much slower than the run's typical step.
    STEP_TIME_OUTLIER = "STEP_TIME_OUTLIER"
    #: Clock offsets too uncertain to order events across hosts.
    CLOCK_UNCERTAIN = "CLOCK_UNCERTAIN"
    #: Clocks that disagree beyond what the collectives allow.
    CLOCK_SKEW = "CLOCK_SKEW"
    #: Pipeline stages whose peak memory differs beyond what the schedule explains.
    STAGE_MEMORY_IMBALANCE = "STAGE_MEMORY_IMBALANCE"
    #: A rank close to its device's memory capacity.
    MEMORY_HEADROOM = "MEMORY_HEADROOM"
    #: A stage's measured peak departs from its estimate.
    MEMORY_ESTIMATE_MISMATCH = "MEMORY_ESTIMATE_MISMATCH"


#: Finding codes in root-cause order: a cause before the symptoms it produces. Lost time is
#: allocated to findings in this order, so the impacts add up to at most the step.
ROOT_CAUSE = (
    Code.HANG,
    Code.COLLECTIVE_DESYNC,
    Code.ALL_TO_ALL_IMBALANCE,
    Code.STRAGGLER_COMPUTE,
    Code.STRAGGLER_HOST,
    Code.STRAGGLER_COMM,
    Code.PIPELINE_STAGE_IMBALANCE,
    Code.PIPELINE_BUBBLE,
    Code.PIPELINE_STALL,
    Code.HOST_BOUND,
    Code.SYNC_WAIT,
    Code.EXPOSED_COMM,
)
#: Findings that stop the job rather than slow it: shown before every other finding, whatever
#: time the others cost (a hang is the root cause of everything after it).
BLOCKING = (Code.HANG, Code.COLLECTIVE_DESYNC)
