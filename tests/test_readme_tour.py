"""The README's "60-second tour", run exactly as written, in order, so that README and code
cannot drift apart.

The commands come from the tour's ```bash block (a trailing `# exits N` comment sets the exit
status a line must end with; every other line must exit 0). They run with bash in a scratch
folder that links the repository's examples/ and sample_traces/, so relative paths work as from
the repository root. `tracelab serve` and `tracelab open` run until their URL answers and are
then stopped with Ctrl-C (SIGINT). Only the environment differs from a user's shell: free ports
through TRACELAB_PORT (the app) and PET_MASTER_PORT (torchrun), so parallel tests never clash.

Two tests: the whole tour with its torchrun captures (`-m torchrun`, about 2 minutes on 2
cores), and the same tour without the torchrun lines, on copies of the committed
sample_traces/ddp and ddp_slow_rank captures in their place (seconds).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SERVERS = ("tracelab serve", "tracelab open")


@dataclass(frozen=True)
class Command:
    line: str
    exit_code: int = 0

    @property
    def is_torchrun(self) -> bool:
        return " torchrun " in f" {self.line} "

    @property
    def is_server(self) -> bool:
        return any(self.line.startswith(s) for s in SERVERS)


def _comment(line: str) -> str:
    """The trailing comment of a shell line (an unquoted # after whitespace), or ''."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[i + 1 :].strip()
    return ""


def tour_commands(readme: Path = REPO / "README.md") -> list[Command]:
    text = readme.read_text()
    section = text.split("## A 60-second tour", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "the README's tour has no ```bash block"
    commands = []
    for raw in block.group(1).replace("\\\n", " ").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        found = re.search(r"\bexits (\d+)", _comment(line))
        commands.append(Command(line, int(found.group(1)) if found else 0))
    return commands


def test_the_tour_is_what_this_test_expects() -> None:
    commands = tour_commands()
    lines = [c.line for c in commands]
    assert sum(c.is_torchrun for c in commands) == 2
    assert any(c.is_server for c in commands)
    report = next(c for c in commands if c.line.startswith("tracelab report"))
    assert report.exit_code == 1  # the gate fails on the slow candidate
    assert lines.index(report.line) > max(
        i for i, c in enumerate(commands) if c.line.startswith("tracelab baseline save")
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scratch(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    work = tmp_path / "tour"
    work.mkdir()
    for name in ("examples", "sample_traces"):
        (work / name).symlink_to(REPO / name)
    bin_dir = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
        "PYTHONUNBUFFERED": "1",
        "TORCH_SHOW_CPP_STACKTRACES": "0",
    }
    return work, env


def _serve(cmd: Command, work: Path, env: dict[str, str], log: Path) -> str:
    """Start a server line, wait until its URL answers, stop it with SIGINT; its output."""
    port = _free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["bash", "-c", f"exec {cmd.line}"],
            cwd=work,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**env, "TRACELAB_PORT": str(port)},
        )
    try:
        deadline = time.monotonic() + 300
        pattern = (
            r"overview of run '[^']+': (\S+)"
            if cmd.line.startswith("tracelab open")
            else r"serving \S+ at (\S+)"
        )
        while True:
            text = log.read_text()
            assert proc.poll() is None, f"{cmd.line} stopped:\n{text[-3000:]}"
            assert time.monotonic() < deadline, f"{cmd.line} never served:\n{text[-3000:]}"
            urls = re.findall(pattern, text)
            if urls:
                try:
                    with urllib.request.urlopen(urls[0], timeout=60) as r:
                        assert r.status == 200
                    break
                except OSError:  # printed before the server listens
                    pass
            time.sleep(0.2)
        assert urls[0].startswith(f"http://127.0.0.1:{port}/")
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
    return log.read_text()


def _run_tour(work: Path, env: dict[str, str], commands: list[Command]) -> dict[str, str]:
    """Run every command in order; each line's output by line."""
    outputs: dict[str, str] = {}
    for n, cmd in enumerate(commands):
        if cmd.is_server:
            outputs[cmd.line] = _serve(cmd, work, env, work.parent / f"server-{n}.log")
            continue
        # torchrun's default port (29500) may be taken by a parallel test: PET_MASTER_PORT
        # is torchrun's own environment form of --master-port.
        run_env = {**env, "PET_MASTER_PORT": str(_free_port())} if cmd.is_torchrun else env
        proc = subprocess.run(
            ["bash", "-c", cmd.line],
            cwd=work,
            env=run_env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        output = proc.stdout + proc.stderr
        assert proc.returncode == cmd.exit_code, (
            f"README tour: `{cmd.line}` exited {proc.returncode}, expected {cmd.exit_code}:\n"
            f"{output[-4000:]}"
        )
        outputs[cmd.line] = output
    return outputs


def _check_gate(work: Path, outputs: dict[str, str]) -> None:
    markdown = (work / "report" / "tracelab-report.md").read_text()
    assert "Performance regression" in markdown
    step_row = next(row for row in markdown.splitlines() if row.startswith("| Step time"))
    assert "regression" in step_row
    assert (work / "report" / "tracelab-report.junit.xml").is_file()
    grep = next(out for line, out in outputs.items() if line.startswith("grep"))
    assert "Step time" in grep
    assert json.loads((work / "exp42.json").read_text())


@pytest.mark.torchrun
def test_the_readme_tour_runs_as_written(tmp_path: Path) -> None:
    work, env = _scratch(tmp_path)
    commands = tour_commands()
    outputs = _run_tour(work, env, commands)
    for cmd in commands:
        if cmd.is_torchrun:
            out = cmd.line.split("--out ")[1].split()[0]
            assert f"captured 10 steps on 4 ranks into {out}/" in outputs[cmd.line]
            assert f"next: tracelab open {out}" in outputs[cmd.line]
            assert (work / out / "manifest.json").is_file()
    _check_gate(work, outputs)


def test_the_readme_tour_on_the_sample_captures(tmp_path: Path) -> None:
    """The tour's tracelab commands, with the committed captures standing in for the two
    torchrun lines (renamed as the examples would have named them)."""
    work, env = _scratch(tmp_path)
    commands = tour_commands()
    for cmd in commands:
        if cmd.is_torchrun:
            out = work / cmd.line.split("--out ")[1].split()[0]
            sample = "ddp_slow_rank" if "slow" in cmd.line else "ddp"
            shutil.copytree(REPO / "sample_traces" / sample, out)
            manifest = json.loads((out / "manifest.json").read_text())
            manifest["run_name"] = out.name
            (out / "manifest.json").write_text(json.dumps(manifest))
    outputs = _run_tour(work, env, [c for c in commands if not c.is_torchrun])
    _check_gate(work, outputs)
