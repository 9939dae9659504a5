"""Threshold parsing: defaults, config file, command line, and the errors they raise."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tracelab.errors import InputError, UsageError
from tracelab.report.thresholds import (
    DEFAULT_CONFIG_FILE,
    GATES,
    Kind,
    load_settings,
    parse_cli_thresholds,
    parse_threshold,
)


def test_defaults_cover_every_gate() -> None:
    s = load_settings(search_dir=None)
    assert set(s.thresholds) == set(GATES)
    assert s.threshold("step_time").text == "+5%"
    assert s.threshold("exposed_comm_share").kind is Kind.POINTS
    assert s.threshold("exposed_comm_share").limit == 2.0
    assert s.threshold("collective_bandwidth").direction == -1
    assert not s.threshold("op_time").gated
    assert (s.alpha, s.warmup_steps, s.min_steps) == (0.05, 1, 9)


@pytest.mark.parametrize(
    ("metric", "text", "kind", "limit", "direction"),
    [
        ("step_time", "+5%", Kind.RELATIVE, 0.05, 1),
        ("step_time", "7.5 %", Kind.RELATIVE, 0.075, 1),
        ("bubble_share", "+2pp", Kind.POINTS, 2.0, 1),
        ("bubble_share", "10%", Kind.RELATIVE, 0.10, 1),
        ("comm_overlap", "-3pp", Kind.POINTS, 3.0, -1),
        ("collective_bandwidth", "15%", Kind.RELATIVE, 0.15, -1),
    ],
)
def test_parse_threshold(metric: str, text: str, kind: Kind, limit: float, direction: int) -> None:
    t = parse_threshold(metric, text)
    assert (t.kind, t.direction) == (kind, direction)
    assert t.limit == pytest.approx(limit)


@pytest.mark.parametrize(
    ("metric", "text", "message"),
    [
        ("step_tme", "+5%", "unknown metric 'step_tme'"),
        ("peak_memory", "+2pp", "applies only to shares"),
        ("collective_bandwidth", "+10%", "Write '-10%'"),
        ("step_time", "-5%", "Write '+5%'"),
        ("step_time", "5", "cannot read threshold"),
        ("step_time", "+5ms", "cannot read threshold"),
    ],
)
def test_bad_thresholds_say_what_to_write(metric: str, text: str, message: str) -> None:
    with pytest.raises(UsageError, match=re.escape(message)):
        parse_threshold(metric, text)


def test_config_file_then_command_line(tmp_path: Path) -> None:
    cfg = tmp_path / DEFAULT_CONFIG_FILE
    cfg.write_text(
        "# thresholds for CI\nthresholds:\n  step_time: +8%   # noisy CPU runners\n"
        "  bubble_share: '+1pp'\n  op_time: +20%\nalpha: 0.01\nwarmup_steps: 2\n"
    )
    s = load_settings(search_dir=tmp_path, cli_thresholds=parse_cli_thresholds(["step_time=+4%"]))
    assert s.config_file == str(cfg)
    assert s.threshold("step_time").text == "+4%"
    assert s.threshold("step_time").source == "command line"
    assert s.threshold("bubble_share").text == "+1pp"
    assert s.threshold("bubble_share").source == str(cfg)
    assert s.threshold("op_time").gated
    assert (s.alpha, s.warmup_steps) == (0.01, 2)
    # An explicit file wins over discovery; command-line settings win over the file.
    other = tmp_path / "other.yml"
    other.write_text("peak_memory: off\n")
    s2 = load_settings(config_file=other, cli_settings={"min_steps": 5}, search_dir=tmp_path)
    assert not s2.threshold("peak_memory").gated
    assert s2.threshold("step_time").text == "+5%"
    assert s2.min_steps == 5


def test_config_file_errors(tmp_path: Path) -> None:
    cfg = tmp_path / "t.yml"
    cfg.write_text("step_time: +5%\nstep_timing: +5%\n")
    with pytest.raises(UsageError, match="unknown metric 'step_timing'"):
        load_settings(config_file=cfg)
    cfg.write_text("step_time +5%\n")
    with pytest.raises(InputError, match="line 1"):
        load_settings(config_file=cfg)
    cfg.write_text("step_time: +5%\nstep_time: +6%\n")
    with pytest.raises(InputError, match="set twice"):
        load_settings(config_file=cfg)
    cfg.write_text("alpha: often\n")
    with pytest.raises(UsageError, match="alpha"):
        load_settings(config_file=cfg)
    cfg.write_text("alpha: 1.5\n")
    with pytest.raises(UsageError, match="alpha must be between"):
        load_settings(config_file=cfg)
    with pytest.raises(InputError, match="not found"):
        load_settings(config_file=tmp_path / "missing.yml")
    with pytest.raises(UsageError, match="NAME=VALUE"):
        parse_cli_thresholds(["step_time"])
