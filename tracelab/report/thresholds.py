"""Which metrics a CI report gates on, and by how much they may move.

Thresholds come from three places, later ones winning: the defaults in `GATES`, a small config
file in the repository (`.tracelab-thresholds.yml` by default), and `--threshold NAME=VALUE` on
the command line. The file is YAML-shaped `name: value` lines:

    # .tracelab-thresholds.yml
    step_time: +5%             # relative change of the median step time
    exposed_comm_share: +2pp   # absolute change, in percentage points of the step
    peak_memory: +3%
    bubble_share: +2pp
    collective_bandwidth: -10% # a bandwidth regression is a drop
    op_time: off               # not gated (still shown)
    alpha: 0.05                # report settings live in the same file (see SETTINGS)

A value is `[+|-]NUMBER%` (relative change), `[+|-]NUMBER pp` (percentage points, only for
shares) or `off`. The sign names the direction that counts as a regression; it may be omitted,
and may not contradict the metric (bandwidth cannot regress upwards). Unknown names are errors.
"""

from __future__ import annotations

import enum
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tracelab.errors import InputError, UsageError

#: Looked up in the current directory when no --thresholds file is given.
DEFAULT_CONFIG_FILE = ".tracelab-thresholds.yml"


class Kind(str, enum.Enum):
    """How a threshold measures change."""

    RELATIVE = "relative"  # candidate / baseline - 1
    POINTS = "points"  # (candidate - baseline) * 100, for shares in 0..1

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, kw_only=True)
class Gate:
    """A metric family the report knows: its unit, which way is worse, its default threshold."""

    name: str
    title: str
    #: Unit of the values ("ms", "share", "bytes", "ratio", "GB/s").
    unit: str
    #: +1 when an increase is a regression (time, memory), -1 when a drop is (bandwidth).
    bad_direction: int
    #: Default threshold text, or "off" (shown, never gated).
    default: str
    description: str


#: The vocabulary of gated metrics, defined once. Report rows carry one of these names.
GATES: dict[str, Gate] = {
    g.name: g
    for g in (
        Gate(
            name="step_time",
            title="Step time",
            unit="ms",
            bad_direction=+1,
            default="+5%",
            description="median step time after warm-up (slowest rank per step), "
            "ratio of medians with a bootstrap CI and a one-sided Mann-Whitney U",
        ),
        Gate(
            name="exposed_comm_share",
            title="Exposed communication",
            unit="share",
            bad_direction=+1,
            default="+2pp",
            description="communication not hidden under compute, as a share of the step",
        ),
        Gate(
            name="comm_overlap",
            title="Comm/compute overlap",
            unit="share",
            bad_direction=-1,
            default="-5pp",
            description="share of communication time overlapped by compute",
        ),
        Gate(
            name="bubble_share",
            title="Pipeline bubble",
            unit="share",
            bad_direction=+1,
            default="+2pp",
            description="idle share of the step, per pipeline stage",
        ),
        Gate(
            name="peak_memory",
            title="Peak memory",
            unit="bytes",
            bad_direction=+1,
            default="+3%",
            description="peak allocated memory, per stage (or rank)",
        ),
        Gate(
            name="memory_imbalance",
            title="Memory imbalance",
            unit="ratio",
            bad_direction=+1,
            default="+5%",
            description="max / mean of per-stage peak memory",
        ),
        Gate(
            name="straggler_wait",
            title="Straggler wait",
            unit="share",
            bad_direction=+1,
            default="+2pp",
            description="time ranks wait at collectives for the last arriver, "
            "as a share of the step (mean over ranks)",
        ),
        Gate(
            name="dim_comm_share",
            title="Communication per dimension",
            unit="share",
            bad_direction=+1,
            default="+2pp",
            description="exposed communication (transfer and waiting) of one parallel "
            "dimension (dp, dp_shard, tp, pp, cp, ep), as a share of the step",
        ),
        Gate(
            name="collective_bandwidth",
            title="Collective bandwidth",
            unit="GB/s",
            bad_direction=-1,
            default="-10%",
            description="bus bandwidth of collectives (nccl-tests busbw)",
        ),
        Gate(
            name="op_time",
            title="Op / kernel time",
            unit="ms",
            bad_direction=+1,
            default="off",
            description="per-op or per-kernel time per step, the top movers",
        ),
    )
}

#: Report settings that may sit next to thresholds in the config file, with their types.
SETTINGS: dict[str, type] = {
    "alpha": float,  # significance level of the Mann-Whitney test
    "warmup_steps": int,  # leading steps dropped on every rank
    "min_steps": int,  # fewer samples a side: warn instead of judging
    "confidence": float,  # of the bootstrap CI
    "resamples": int,  # bootstrap resamples
    "seed": int,  # bootstrap seed
    "top_ops": int,  # how many ops/kernels to list as top movers
}

_VALUE = re.compile(r"^(?P<sign>[+-])?\s*(?P<num>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>%|pp)$")


@dataclass(frozen=True, kw_only=True)
class Threshold:
    """How far one metric family may move in its bad direction before it is a regression."""

    metric: str
    #: None when the metric is not gated ("off").
    kind: Kind | None
    #: Magnitude: a fraction for RELATIVE (0.05 = 5%), points for POINTS (2.0 = 2pp).
    limit: float
    #: +1: increases are bad; -1: drops are bad.
    direction: int
    #: Where it came from: "default", a file path, or "command line".
    source: str = "default"

    @property
    def gated(self) -> bool:
        return self.kind is not None

    @property
    def text(self) -> str:
        if self.kind is None:
            return "off"
        sign = "+" if self.direction > 0 else "-"
        if self.kind is Kind.RELATIVE:
            return f"{sign}{self.limit * 100:g}%"
        return f"{sign}{self.limit:g}pp"


@dataclass(frozen=True, kw_only=True)
class ReportSettings:
    """Everything that decides a verdict, recorded in every report."""

    thresholds: dict[str, Threshold] = field(default_factory=dict)
    alpha: float = 0.05
    warmup_steps: int = 1
    min_steps: int = 9
    confidence: float = 0.95
    resamples: int = 10_000
    seed: int = 0
    top_ops: int = 10
    #: The config file that was read, if any.
    config_file: str | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 1.0:
            raise UsageError(f"alpha must be between 0 and 1 (exclusive), not {self.alpha}")
        if not 0.0 < self.confidence < 1.0:
            raise UsageError(f"confidence must be between 0 and 1, not {self.confidence}")
        if self.warmup_steps < 0:
            raise UsageError(f"warmup_steps must be 0 or more, not {self.warmup_steps}")
        if self.min_steps < 2:
            raise UsageError(f"min_steps must be at least 2, not {self.min_steps}")
        if self.resamples < 100:
            raise UsageError(f"resamples must be at least 100, not {self.resamples}")
        if self.top_ops < 0:
            raise UsageError(f"top_ops must be 0 or more, not {self.top_ops}")
        if not 0 <= self.seed < 2**63:
            raise UsageError(f"seed must be 0 or more (below 2^63), not {self.seed}")

    def threshold(self, metric: str) -> Threshold:
        return self.thresholds.get(metric) or parse_threshold(metric, GATES[metric].default)


def _unknown(name: str, where: str) -> UsageError:
    known = ", ".join(GATES)
    return UsageError(
        f"{where}: unknown metric {name!r}. Known metrics: {known}; "
        f"settings: {', '.join(SETTINGS)}."
    )


def parse_threshold(metric: str, text: str, *, source: str = "default") -> Threshold:
    """Parse one threshold value for `metric`; errors name the setting and the accepted forms."""
    gate = GATES.get(metric)
    if gate is None:
        raise _unknown(metric, source)
    raw = str(text).strip()
    if raw.lower() in ("off", "none", "false"):
        return Threshold(
            metric=metric, kind=None, limit=0.0, direction=gate.bad_direction, source=source
        )
    match = _VALUE.match(raw)
    if match is None:
        raise UsageError(
            f"{source}: {metric}: cannot read threshold {raw!r}. Write a relative change such as "
            f"'+5%', a change in percentage points such as '+2pp' (shares only), or 'off'."
        )
    unit = match["unit"]
    if unit == "pp" and gate.unit != "share":
        raise UsageError(
            f"{source}: {metric}: 'pp' (percentage points) applies only to shares; "
            f"{metric} is in {gate.unit}, so write a relative change such as '+5%'."
        )
    sign = match["sign"]
    direction = gate.bad_direction if sign is None else (+1 if sign == "+" else -1)
    if direction != gate.bad_direction:
        worse = "an increase" if gate.bad_direction > 0 else "a drop"
        fixed = ("+" if gate.bad_direction > 0 else "-") + raw.lstrip("+-")
        raise UsageError(
            f"{source}: {metric}: {raw!r} points the wrong way; for {metric} {worse} is the "
            f"regression. Write {fixed!r}."
        )
    number = float(match["num"])
    limit = number / 100.0 if unit == "%" else number
    return Threshold(
        metric=metric,
        kind=Kind.RELATIVE if unit == "%" else Kind.POINTS,
        limit=limit,
        direction=direction,
        source=source,
    )


def parse_config_text(text: str, *, source: str) -> dict[str, str]:
    """`name: value` lines (a YAML subset) into a dict; comments and blank lines are skipped."""
    entries: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        body = line.split("#", 1)[0].strip()
        if not body:
            continue
        if body.rstrip(":") == "thresholds" and body.endswith(":"):
            continue  # an optional `thresholds:` header; entries below may be indented
        name, sep, value = body.partition(":")
        if not sep or not name.strip() or not value.strip():
            raise InputError(
                f"line {lineno}: expected 'name: value' (e.g. 'step_time: +5%'), got {line!r}",
                path=source,
            )
        key = name.strip()
        if key in entries:
            raise InputError(f"line {lineno}: {key!r} is set twice", path=source)
        entries[key] = value.strip().strip("'\"")
    return entries


def _apply(
    entries: dict[str, str], source: str, thresholds: dict[str, Threshold], opts: dict[str, Any]
) -> None:
    for key, value in entries.items():
        if key in SETTINGS:
            try:
                opts[key] = SETTINGS[key](value)
            except ValueError:
                raise UsageError(
                    f"{source}: {key}: {value!r} is not a valid {SETTINGS[key].__name__}"
                ) from None
        elif key in GATES:
            thresholds[key] = parse_threshold(key, value, source=source)
        else:
            raise _unknown(key, source)


def parse_cli_thresholds(items: list[str]) -> dict[str, str]:
    """`NAME=VALUE` (or `NAME:VALUE`) items from repeated --threshold options."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            name, sep, value = item.partition(":")
        if not sep or not name.strip() or not value.strip():
            raise UsageError(f"--threshold {item!r}: write NAME=VALUE, e.g. step_time=+5%")
        out[name.strip()] = value.strip()
    return out


def load_settings(
    *,
    config_file: str | os.PathLike[str] | None = None,
    cli_thresholds: dict[str, str] | None = None,
    cli_settings: dict[str, Any] | None = None,
    search_dir: str | os.PathLike[str] | None = ".",
) -> ReportSettings:
    """Defaults, then the config file, then the command line.

    With no `config_file`, `.tracelab-thresholds.yml` in `search_dir` is used when it exists.
    """
    thresholds = {name: parse_threshold(name, gate.default) for name, gate in GATES.items()}
    opts: dict[str, Any] = {}
    used: str | None = None
    path: Path | None = None
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise InputError(
                "thresholds file not found; check the --thresholds path", path=str(path)
            )
    elif search_dir is not None and (Path(search_dir) / DEFAULT_CONFIG_FILE).is_file():
        path = Path(search_dir) / DEFAULT_CONFIG_FILE
    if path is not None:
        used = str(path)
        try:
            text = path.read_bytes().decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise InputError(
                f"the thresholds file is not UTF-8 text ({exc.reason} at byte "
                f"{exc.start}); save it as UTF-8.",
                path=str(path),
            ) from None
        except OSError as exc:
            raise InputError(
                f"cannot read the thresholds file ({exc.strerror}).", path=str(path)
            ) from None
        _apply(parse_config_text(text, source=used), used, thresholds, opts)
    if cli_thresholds:
        _apply(cli_thresholds, "--threshold", thresholds, opts)
        for name in cli_thresholds:
            if name in thresholds:
                thresholds[name] = replace(thresholds[name], source="command line")
    for key, value in (cli_settings or {}).items():
        if value is not None:
            opts[key] = value
    return ReportSettings(thresholds=thresholds, config_file=used, **opts)
