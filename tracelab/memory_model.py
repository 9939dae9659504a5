"""The memory model: what one rank of a pipelined job holds at its peak, stage by stage.

One definition, used by the memory analyzer (a run's estimate against its measured peak) and by
`tracelab estimate` (a prediction before a job runs); docs/metrics.md, "Memory estimate".

    peak(rank) = model states + activations + allowance

- **Model states**: parameters, gradients and optimizer states. From a capture, the bytes the
  collector counted on the rank (sharded sizes as they are). Before a run, 2 + 2 + 12 bytes per
  parameter for mixed-precision Adam (bf16 weights and gradients; fp32 master copy, m and v),
  the optimizer part divided by the ZeRO/FSDP degree (zero=1), the gradients too (zero=2), and
  the weights too (zero=3, FSDP).
- **Activations**: one microbatch's activation bytes per stage, times the microbatches that
  stage holds at the rank's peak. The schedule decides that count: the textbook orders of
  tracelab.derived.schedules are replayed (a forward adds its stage's bytes, that microbatch's
  backward frees them) and the highest running sum is the peak, so unequal stages and
  interleaved chunks weigh what they hold; schedules without an order use their published count.
  Per layer, Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
  Models", Table 2): s*b*h*(34 + 5*a*s/h) bytes with 16-bit activations and no parallelism;
  s*b*h*(10 + 24/t + 5*a*s/(h*t)) with tensor parallelism t; s*b*h/t*(34 + 5*a*s/h) with
  tensor and sequence parallelism; the attention's 5*a*s/h term is dropped under selective
  recomputation and only the layer input (2*s*b*h) is kept under full recomputation. Context
  parallelism c divides the sequence.
- **Allowance**: WORKSPACE_SHARE of the states and activations, for the allocator's
  fragmentation, communication buffers and kernels' workspace (a documented constant, never
  fitted to a run).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from tracelab.derived import schedules
from tracelab.errors import InputError

#: Allowance for workspace, communication buffers and fragmentation, as a share of the states
#: and activations (docs/metrics.md, "Memory estimate").
WORKSPACE_SHARE = 0.05
#: Bytes per parameter of the model states, by optimizer: (weights, gradients, optimizer).
STATE_BYTES = {
    "adam": (2, 2, 12),  # mixed precision: bf16 weights and grads; fp32 master, m, v
    "adam_fp32": (4, 4, 8),  # fp32 weights and grads; m, v
    "sgd": (4, 4, 0),
    "sgd_momentum": (4, 4, 4),
}
RECOMPUTE = ("none", "selective", "full")
#: Schedules whose in-flight count is a published figure rather than a replayed order:
#: microbatches of one *stage* (chunk) each rank holds at its peak, as a function of (p, m, v).
_PUBLISHED = {
    # ZB-V (Qi et al. 2024): two chunks per rank in a V, the same peak as 1F1B's first stage,
    # p microbatches of a whole rank = 2p chunk-microbatches, on every rank.
    "zbv": lambda p, m, v: min(m * v, 2 * p),
    # DualPipe/DualPipeV (DeepSeek-V3 report, Table 2): PP + 1 microbatches of a rank's layers.
    "dualpipev": lambda p, m, v: min(m * v, 2 * (p + 1)),
    # LoopedBFS runs every forward of every chunk before any backward.
    "looped_bfs": lambda p, m, v: m * v,
}


#: Schedules replayed with another's order: the interleaved zero-bubble schedule keeps
#: interleaved 1F1B's activation memory (ZB-H1's memory limit, per chunk).
_REPLAYED_AS = {"zero_bubble": "interleaved_1f1b"}
#: The most microbatches per step a config may give (a step of 4M tokens in sequences of 4,096
#: is 1,024; the replay's time and memory grow with them).
MAX_MICROBATCHES = 65_536
#: Schedules that place two stages on each rank in a V (stage k and 2p - 1 - k): v is 2.
V_SHAPED = ("zbv", "dualpipev")


def interleave_factor(p: int, v: int) -> float:
    """Korthikanti et al. 4.2.3: the first stage of an interleaved schedule with v chunks per
    rank holds (1 + (p - 1) / (p * v)) times the activations of the non-interleaved one."""
    return 1.0 + (p - 1) / (p * v)


def activation_bytes_per_layer(
    *, s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False, recompute: str = "none"
) -> float:
    """Activation bytes one transformer layer keeps for backward (16-bit activations), per
    Korthikanti et al. 2022, Table 2. s: sequence, b: microbatch, h: hidden, a: heads, t: tensor
    parallel degree, sp: sequence parallelism (with t), recompute: none, selective or full."""
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {RECOMPUTE}, not {recompute!r}")
    sbh = s * b * h
    if recompute == "full":
        return 2.0 * sbh / (t if sp else 1)
    attention = 0.0 if recompute == "selective" else 5.0 * a * s / h
    if t == 1 or sp:
        return sbh / t * (34.0 + attention)
    return sbh * (10.0 + 24.0 / t + attention / t)


def model_state_bytes(
    params: float, *, optimizer: str = "adam", zero: int = 0, dp: int = 1
) -> tuple[float, float, float]:
    """(weights, gradients, optimizer states) bytes of `params` parameters on one rank, with
    ZeRO stage `zero` (3 = FSDP) over `dp` data-parallel ranks."""
    if optimizer not in STATE_BYTES:
        raise ValueError(f"optimizer must be one of {sorted(STATE_BYTES)}, not {optimizer!r}")
    w, g, o = STATE_BYTES[optimizer]
    return (
        params * w / (dp if zero >= 3 else 1),
        params * g / (dp if zero >= 2 else 1),
        params * o / (dp if zero >= 1 else 1),
    )


def peak_in_flight(
    schedule: str | None,
    p: int,
    m: int,
    v: int,
    stage_bytes: Mapping[int, float],
    kept_after_backward: Mapping[int, float] | None = None,
) -> dict[int, tuple[float, dict[int, int]]]:
    """Per rank: (activation bytes at its peak, microbatches each of its stages then holds).

    `stage_bytes` is one microbatch's activation bytes per stage index (stage k runs on rank
    k % p, looped placement; V-shaped schedules use their published count). The orders of
    tracelab.derived.schedules are replayed: a forward adds its stage's bytes, the backward of
    the same microbatch (B, or I for zero-bubble orders) frees them, but for
    `kept_after_backward[k]` bytes that stay until the step's end (the runtime schedules wait
    for their sends only then, so each send's tensor, the stage's output and input gradient,
    outlives its backward)."""
    kept = kept_after_backward or {}
    if schedule in _REPLAYED_AS:
        schedule = _REPLAYED_AS[schedule]
    if schedule in schedules.SCHEDULES:
        order = schedules.make_order(schedule, p, m, v)
        out: dict[int, tuple[float, dict[int, int]]] = {}
        for rank, acts in order.items():
            held: dict[int, int] = {}
            cur = best = 0.0
            at_best: dict[int, int] = {}
            for stage, kind, _mb in acts:
                if kind == "F":
                    held[stage] = held.get(stage, 0) + 1
                    cur += stage_bytes.get(stage, 0.0)
                    if cur > best:
                        best, at_best = cur, dict(held)
                elif kind in ("B", "I"):
                    held[stage] = held.get(stage, 0) - 1
                    cur -= stage_bytes.get(stage, 0.0) - kept.get(stage, 0.0)
                    if cur > best:
                        best, at_best = cur, dict(held)
            out[rank] = (best, at_best)
        return out
    if schedule in _PUBLISHED:
        count = _PUBLISHED[schedule](p, m, v)
        out = {}
        for rank in range(p):
            mine = [k for k in stage_bytes if _rank_of(schedule, k, p) == rank]
            per_stage = {k: count / max(1, len(mine)) for k in mine}
            total = sum(stage_bytes[k] * n for k, n in per_stage.items())
            out[rank] = (total, {k: round(n) for k, n in per_stage.items()})
        return out
    raise ValueError(
        f"no in-flight count for schedule {schedule!r}; known: "
        f"{', '.join(sorted(set(schedules.SCHEDULES) | set(_PUBLISHED)))}"
    )


def _rank_of(schedule: str, stage: int, p: int) -> int:
    if schedule in V_SHAPED:
        return stage if stage < p else 2 * p - 1 - stage
    return stage % p


@dataclass(frozen=True, kw_only=True)
class RankEstimate:
    """One rank's predicted peak, in bytes, and its parts. The peak falls in one of two phases:
    the pipeline's (activations in flight plus the backward's weight-gradient temporary) or the
    optimizer step's (its intermediate, e.g. foreach Adam's sqrt(v) of every parameter)."""

    rank: int
    stages: tuple[int, ...]
    #: Microbatches each of its stages holds at the peak.
    in_flight: dict[int, int]
    model_states_bytes: float
    activations_bytes: float
    backward_workspace_bytes: float = 0.0
    optimizer_workspace_bytes: float = 0.0

    @property
    def phase(self) -> str:
        pipe = self.activations_bytes + self.backward_workspace_bytes
        return "optimizer" if self.optimizer_workspace_bytes > pipe else "pipeline"

    @property
    def transient_bytes(self) -> float:
        """What the peak phase adds to the model states."""
        return max(
            self.activations_bytes + self.backward_workspace_bytes, self.optimizer_workspace_bytes
        )

    @property
    def allowance_bytes(self) -> float:
        return WORKSPACE_SHARE * (self.model_states_bytes + self.transient_bytes)

    @property
    def total_bytes(self) -> float:
        return self.model_states_bytes + self.transient_bytes + self.allowance_bytes


def estimate_ranks(
    *,
    schedule: str | None,
    p: int,
    m: int,
    v: int,
    stage_activation_bytes: Mapping[int, float],
    rank_state_bytes: Mapping[int, float],
    rank_backward_workspace: Mapping[int, float] | None = None,
    rank_optimizer_workspace: Mapping[int, float] | None = None,
    kept_after_backward: Mapping[int, float] | None = None,
) -> list[RankEstimate]:
    """Every pipeline rank's estimate from per-stage activation bytes of one microbatch and
    per-rank model-state and workspace bytes. Without a pipeline (p = 1, schedule None) the rank
    holds one microbatch."""
    if p <= 1 or schedule is None:
        held = {0: (sum(stage_activation_bytes.values()), {k: 1 for k in stage_activation_bytes})}
    else:
        held = peak_in_flight(schedule, p, m, v, stage_activation_bytes, kept_after_backward)
    bw = rank_backward_workspace or {}
    ow = rank_optimizer_workspace or {}
    return [
        RankEstimate(
            rank=rank,
            stages=tuple(sorted(counts)),
            in_flight=counts,
            model_states_bytes=float(rank_state_bytes.get(rank, 0.0)),
            activations_bytes=act,
            backward_workspace_bytes=float(bw.get(rank, 0.0)),
            optimizer_workspace_bytes=float(ow.get(rank, 0.0)),
        )
        for rank, (act, counts) in sorted(held.items())
    ]


def layers_per_stage(layers: int, stages: int) -> list[int]:
    """Layers of each of `stages` stages, as even as possible, the extra ones on the last
    stages (the first stage also holds the embedding; the last, the output layer)."""
    base, extra = divmod(layers, stages)
    return [base + (1 if k >= stages - extra else 0) for k in range(stages)]


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """A GPT-style transformer and its parallel layout, for a prediction before a run.

    Degrees: dp (data), tp (tensor), pp (pipeline ranks), cp (context); v stages per pipeline
    rank (interleaved, V-shaped). zero: ZeRO stage over dp (3 = FSDP). act_bytes: bytes per
    activation element relative to 16-bit (1.0 for bf16/fp16, 2.0 for fp32)."""

    layers: int
    hidden: int
    seq: int
    microbatch: int
    heads: int
    vocab: int = 0
    microbatches: int = 1
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    v: int = 1
    schedule: str = "1f1b"
    sp: bool = False
    recompute: str = "none"
    optimizer: str = "adam"
    zero: int = 0
    act_bytes: float = 1.0
    layers_per_stage: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name in CONFIG_KEYS and (why := setting_problem(f.name, getattr(self, f.name))):
                raise ValueError(why)
        if self.hidden % self.tp or self.seq % self.cp:
            raise ValueError("hidden must divide by tp and seq by cp")
        if self.schedule in V_SHAPED and self.pp > 1 and self.v != 2:
            # stages 2p.. would map to no rank: their parameters and activations were dropped
            raise ValueError(
                f"{self.schedule} places two stages on each rank in a V: v must be 2, not {self.v}"
            )
        stages = self.pp * self.v
        if self.layers_per_stage is not None:
            _stage_list(self.layers_per_stage, stages, self.layers)
        elif self.layers < stages:
            raise ValueError(
                f"{self.layers} layers cannot fill the pipeline's {stages} stages (pp x v): each "
                "stage needs at least one layer"
            )


def setting_problem(key: str, value: object) -> str | None:
    """What is wrong with one setting's value on its own (None: nothing), for a config file
    (read_config: exit 3, naming it) and for ModelConfig alike. Settings that are wrong only
    together (tp must divide hidden) are ModelConfig's."""
    if key in ("layers", "hidden", "seq", "microbatch", "heads", "microbatches"):
        if value < 1:  # type: ignore[operator]
            return f"{key} must be >= 1, not {value!r}"
    if key in ("dp", "tp", "pp", "cp", "v") and value < 1:  # type: ignore[operator]
        return f"the degree {key} must be >= 1, not {value!r}"
    if key == "microbatches" and value > MAX_MICROBATCHES:  # type: ignore[operator]
        # the schedules are replayed microbatch by microbatch: a million took 7.7 s, 892 MB
        return f"microbatches must be at most {MAX_MICROBATCHES:,} per step, not {value:,}"
    if key == "vocab" and value < 0:  # type: ignore[operator]
        return f"vocab must be >= 0, not {value!r}"
    if key == "zero" and value not in (0, 1, 2, 3):
        return f"zero must be 0, 1, 2 or 3 (the ZeRO stage), not {value!r}"
    if key == "recompute" and value not in RECOMPUTE:
        return f"recompute must be one of {RECOMPUTE}, not {value!r}"
    if key == "optimizer" and value not in STATE_BYTES:
        return f"optimizer must be one of {sorted(STATE_BYTES)}, not {value!r}"
    if key == "schedule":
        known = {*schedules.SCHEDULES, *_PUBLISHED, *_REPLAYED_AS}
        if value not in known:
            return f"schedule must be one of {sorted(known)}, not {value!r}"
    if key == "layers_per_stage" and value is not None and any(n < 1 for n in value):  # type: ignore[attr-defined]
        # a stage of no layers was dropped from the estimate, and its rank shown holding nothing
        return f"layers_per_stage must give each stage at least one layer, not {list(value)}"  # type: ignore[call-overload]
    if key == "dtype" and value not in DTYPES:
        return f"dtype must be one of {sorted(DTYPES)}, not {value!r}"
    return None


def stage_activation_bytes(cfg: ModelConfig) -> dict[int, float]:
    """One microbatch's activation bytes per stage: its layers (Table 2), plus on the first
    stage the embedding's dropout mask (s*b*h/t) and on the last stage the final LayerNorm,
    output projection and fp32 logits (4*s*b*h/t * (1 + vocab/h)), Korthikanti et al. 4.3."""
    stages = cfg.pp * cfg.v
    per = _stage_list(cfg.layers_per_stage, stages, cfg.layers)
    s = cfg.seq // cfg.cp
    t = cfg.tp
    layer = activation_bytes_per_layer(
        s=s, b=cfg.microbatch, h=cfg.hidden, a=cfg.heads, t=t, sp=cfg.sp, recompute=cfg.recompute
    )
    sbh = s * cfg.microbatch * cfg.hidden
    out = {k: n * layer * cfg.act_bytes for k, n in enumerate(per)}
    out[0] += sbh / t * cfg.act_bytes
    if cfg.vocab:
        out[stages - 1] += 4.0 * sbh / t * (1.0 + cfg.vocab / cfg.hidden) * cfg.act_bytes
    return out


def stage_params(cfg: ModelConfig) -> dict[int, float]:
    """Parameters each stage holds on one tensor-parallel rank: 12h^2 + 13h per layer, the
    word and position embeddings on the first stage, the (tied) output layer's copy on the last
    stage when it is another stage."""
    stages = cfg.pp * cfg.v
    per = _stage_list(cfg.layers_per_stage, stages, cfg.layers)
    h = cfg.hidden
    out = {k: n * (12.0 * h * h + 13.0 * h) / cfg.tp for k, n in enumerate(per)}
    out[0] += cfg.vocab * h / cfg.tp + cfg.seq * h
    if stages > 1:
        out[stages - 1] += cfg.vocab * h / cfg.tp
    return out


def predict(cfg: ModelConfig) -> list[RankEstimate]:
    """Every pipeline rank's predicted peak for `cfg` (one tensor/data/context-parallel rank of
    each pipeline rank: they are alike)."""
    params = stage_params(cfg)
    states: dict[int, float] = {}
    opt_ws: dict[int, float] = {}
    for k, n in params.items():
        rank = _rank_of(cfg.schedule, k, cfg.pp)
        w, g, o = model_state_bytes(n, optimizer=cfg.optimizer, zero=cfg.zero, dp=cfg.dp)
        states[rank] = states.get(rank, 0.0) + w + g + o
        opt_ws[rank] = opt_ws.get(rank, 0.0) + optimizer_workspace(
            moment_bytes(o, cfg.optimizer), cfg.optimizer
        )
    # The backward's weight-gradient temporary: the MLP's 4h x h matrix, in the gradients' dtype.
    grad_bytes = STATE_BYTES[cfg.optimizer][1]
    bw = {r: 4.0 * cfg.hidden * cfg.hidden / cfg.tp * grad_bytes for r in states}
    return estimate_ranks(
        schedule=cfg.schedule if cfg.pp > 1 else None,
        p=cfg.pp,
        m=cfg.microbatches,
        v=cfg.v,
        stage_activation_bytes=stage_activation_bytes(cfg),
        rank_state_bytes=states,
        rank_backward_workspace=bw,
        rank_optimizer_workspace=opt_ws,
    )


def optimizer_workspace(moment_bytes: float, optimizer: str) -> float:
    """The optimizer step's intermediate: foreach Adam/AdamW allocate sqrt(v) for every
    parameter at once, one fp32 tensor the size of one of their two moments, m and v (half
    `moment_bytes`, the bytes of both); SGD updates in place. A capture measures the moments
    (torch's optimizer state); an estimate takes them out of the optimizer states
    (moment_bytes)."""
    return moment_bytes / 2.0 if optimizer.startswith("adam") else 0.0


#: Of STATE_BYTES' optimizer bytes per parameter, those of Adam's moments m and v (mixed
#: precision keeps its fp32 master weights there too, which sqrt(v) does not copy).
MOMENT_BYTES = {"adam": 8, "adam_fp32": 8, "sgd": 0, "sgd_momentum": 4}


def moment_bytes(optimizer_bytes: float, optimizer: str) -> float:
    """The moments' share of a rank's optimizer-state bytes (STATE_BYTES, MOMENT_BYTES)."""
    per_param = STATE_BYTES[optimizer][2]
    return optimizer_bytes * MOMENT_BYTES[optimizer] / per_param if per_param else 0.0


CONFIG_KEYS = {
    "layers": int,
    "hidden": int,
    "seq": int,
    "microbatch": int,
    "heads": int,
    "vocab": int,
    "microbatches": int,
    "dp": int,
    "tp": int,
    "pp": int,
    "cp": int,
    "v": int,
    "schedule": str,
    "sp": bool,
    "recompute": str,
    "optimizer": str,
    "zero": int,
    "dtype": str,
    "layers_per_stage": list,
}
#: The settings every config needs (the model's shape and the microbatch).
REQUIRED_KEYS = ("layers", "hidden", "seq", "microbatch", "heads")
#: Bytes per activation element relative to 16-bit, by dtype name.
DTYPES = {"bf16": 1.0, "fp16": 1.0, "fp32": 2.0}


def config_from_mapping(raw: Mapping[str, object], where: str = "the config") -> ModelConfig:
    """A ModelConfig from a YAML/JSON mapping (CONFIG_KEYS); an unknown key or a bad value is a
    ValueError that names it."""
    kw = checked_settings(raw, where)
    missing = [k for k in REQUIRED_KEYS if k not in kw]
    if missing:
        raise ValueError(
            f"{where}: missing setting(s) {missing}; every config needs {REQUIRED_KEYS}"
        )
    kw["act_bytes"] = DTYPES[str(kw.pop("dtype", "bf16"))]
    return ModelConfig(**kw)  # type: ignore[arg-type]


def checked_settings(raw: Mapping[str, object], where: str) -> dict[str, object]:
    """The settings of `raw` whose keys and value types are CONFIG_KEYS' (None values left
    out): a ValueError names the first that is not (`"sp": "false"` is text, not false)."""
    unknown = sorted(set(raw) - set(CONFIG_KEYS))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; known: {sorted(CONFIG_KEYS)}")
    kw: dict[str, object] = {}
    for key, value in raw.items():
        kind = CONFIG_KEYS[key]
        if value is None:
            continue
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise ValueError(f"{where}: {key} must be an integer, not {value!r}")
        if kind is str and not isinstance(value, str):
            raise ValueError(f"{where}: {key} must be text, not {value!r}")
        if kind is bool and not isinstance(value, bool):
            raise ValueError(f"{where}: {key} must be true or false, not {value!r}")
        if kind is list:
            if not isinstance(value, (list, tuple)) or any(
                isinstance(x, bool) or not isinstance(x, int) for x in value
            ):
                raise ValueError(f"{where}: {key} must be a list of integers, not {value!r}")
            value = tuple(value)
        if why := setting_problem(key, value):
            raise ValueError(f"{where}: {why}")
        kw[key] = value
    return kw


def read_config(path: str) -> dict[str, object]:
    """The settings of a YAML or JSON config file, their types checked (checked_settings); a
    file that cannot be read or parsed, or holds no mapping, is an InputError naming it."""
    import json
    from pathlib import Path

    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read the config: {_reason(exc)}", path) from None
    if path.endswith((".yaml", ".yml")):
        import yaml

        try:
            raw = yaml.safe_load(text)
        except (yaml.YAMLError, RecursionError) as exc:
            raise InputError(f"not a YAML mapping of settings: {exc}", path) from None
    else:
        try:
            raw = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise InputError(f"not a JSON mapping of settings: {exc}", path) from None
    if not isinstance(raw, dict):
        raise InputError("the config must be a mapping of settings (key: value).", path)
    try:
        return checked_settings(raw, path)
    except ValueError as exc:
        raise InputError(str(exc).removeprefix(f"{path}: "), path) from None


def _reason(exc: Exception) -> str:
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def load_config(path: str) -> ModelConfig:
    """A ModelConfig from a YAML or JSON file (read_config; a bad value is a ValueError)."""
    return config_from_mapping(read_config(path), path)


def _stage_list(values: Sequence[int] | None, stages: int, layers: int) -> list[int]:
    if values is None:
        return layers_per_stage(layers, stages)
    if len(values) != stages or sum(values) != layers:
        raise ValueError(
            f"layers per stage {list(values)} must list {stages} stages adding up to {layers}"
        )
    return list(values)
