"""`tracelab report` fails the gate on a hang or desync verdict stored with the candidate run,
whatever the baseline, and every format shows the verdict first. The dumps are the real gloo
Flight Recorder fixtures of tests/hang/fixtures in a synthetic 2-rank gloo capture; the oracle
is `tracelab hang --format json` on the same dumps."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.foundation.hostile import cli
from tests.hang.captures import FIX, capture, hostile_capture
from tracelab.hang.render import entry_text
from tracelab.ingest import ingest

#: Dump text that would break each format if it were not escaped: markup, a CDATA end, a
#: Markdown table pipe and a newline (in the op's name and in its stack).
OP = "<script>window.hacked=1</script>]]> a|b\nsecond line"
FRAME = {"name": "<img src=x onerror=alert(1)>|f]]>", "filename": "/home/u/tr|ain\n.py", "line": 7}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("gate")
    db = tmp / "s.duckdb"
    for case, name in (("skip", "skip"), ("size", "size"), ("kill", "kill"), (None, "clean")):
        ingest([str(capture(tmp / name, case, name))], db=str(db), workers=1)
    ingest([str(hostile_capture(tmp / "h", OP, "hostile", [FRAME]))], db=str(db), workers=1)
    return db


def report(db: Path, base: str, cand: str, fmt: str) -> tuple[int, str]:
    res = cli("report", "--baseline", base, "--candidate", cand, "--db", str(db), "--format", fmt)
    return res.code, res.out


def oracle(case: str) -> dict:  # type: ignore[type-arg]
    res = cli("hang", str(FIX / case), "--format", "json")
    assert res.code == 1, res.err
    return json.loads(res.out)["verdict"]  # type: ignore[no-any-return]


def test_a_hang_fails_the_gate_by_itself_whatever_the_baseline(store: Path) -> None:
    # The same traces without dumps pass (3 steps: too few to judge, a warning, exit 0) ...
    code, out = report(store, "clean", "clean", "json")
    assert code == 0 and json.loads(out)["verdict"] == "warn" and "hang" not in json.loads(out)
    # ... and with the candidate's dumps the gate fails, against a clean baseline or a baseline
    # that hung the same way (the finding is then not new, and still fails the gate).
    for base in ("clean", "skip", "size"):
        code, out = report(store, base, "skip", "json")
        doc = json.loads(out)
        assert code == 1 and doc["exit_code"] == 1 and doc["verdict"] == "hang", base
        assert doc["regressions"] == []
    # A hung baseline does not fail a clean candidate.
    code, out = report(store, "skip", "clean", "json")
    assert code == 0 and json.loads(out)["verdict"] == "warn"


@pytest.mark.parametrize("case", ["skip", "size", "kill"])
def test_json_carries_tracelab_hangs_verdict(store: Path, case: str) -> None:
    v = oracle(case)
    code, out = report(store, "clean", case, "json")
    hang = json.loads(out)["hang"]
    assert code == 1
    assert hang["code"] == ("COLLECTIVE_DESYNC" if v["kind"] == "size_mismatch" else "HANG")
    fields = {f["label"]: f["value"] for f in hang["fields"]}
    assert fields["Collective"] == v["op"] == "gloo:all_reduce"
    assert fields["Sequence number"] == str(v["seq"])
    members = ", ".join(map(str, v["members"]))
    assert fields["Process group"] == f"{v['process_group']} (ranks {members})"
    absent = ", ".join(sorted(v["absent"]))
    if v["kind"] == "not_entered":
        assert fields["Never entered it (ranks)"] == absent == "1"
        # Each rank that never entered, with its last op as the dump has it.
        assert fields["Rank 1's last op"] == entry_text(v["absent"]["1"])
        assert fields["Rank 1's last op"].startswith("#4 gloo:all_reduce")
    if v["kind"] == "missing_rank":
        assert fields["Left no dump (ranks)"] == absent == "1"
    assert fields["Fix"] == hang["suggestion"] and list(fields)[-1] == "Fix"
    assert [k["label"] for k in hang["fields"]][:3] == [
        "Collective",
        "Sequence number",
        "Process group",
    ]


def test_every_format_shows_the_hang_first(store: Path) -> None:
    v = oracle("skip")
    title = f"rank(s) 1 never entered {v['op']} #{v['seq']}"
    md_title = title.replace("_", "\\_")  # Markdown-escaped
    code, md = report(store, "clean", "skip", "markdown")
    lines = md.splitlines()
    assert code == 1
    assert lines[2] == "🛑 **Hang in the candidate** (Flight Recorder): " + md_title
    # The verdict's section comes before the runs, the metrics and the findings.
    head = lines.index(f"### 🛑 `HANG`: {md_title}")
    assert head == 4 and head < md.index("**Baseline**") and head < md.index("| Metric |")
    assert "- **Rank 1's last op**: #4 gloo:all\\_reduce \\[1024\\] Float" in md
    assert "- **Never entered it (ranks)**: 1" in md and "- **Fix**: Rank(s) 1 never" in md

    code, html = report(store, "clean", "skip", "html")
    assert code == 1 and 'class="verdict v-hang"' in html
    assert html.index('id="hang"') < html.index("<h2>Metrics</h2>") < html.index("New findings")

    code, xml = report(store, "clean", "skip", "junit")
    suite = ET.fromstring(xml).find("testsuite")
    assert code == 1 and suite is not None
    cases = suite.findall("testcase")
    assert cases[0].get("classname") == "tracelab.report.hang" and cases[0].get("name") == "HANG"
    failure = cases[0].find("failure")
    assert failure is not None and failure.get("message") == f"HANG: {title}"
    assert "Rank 1's last op: #4 gloo:all_reduce [1024] Float" in (failure.text or "")
    assert int(suite.get("failures", "")) == 1 and int(suite.get("tests", "")) == len(cases)

    # Without a verdict nothing of it appears.
    _, clean_md = report(store, "skip", "clean", "markdown")
    _, clean_html = report(store, "skip", "clean", "html")
    _, clean_xml = report(store, "skip", "clean", "junit")
    assert "🛑" not in clean_md and 'id="hang"' not in clean_html
    assert ".v-hang{" not in clean_html and 'class="verdict v-warn"' in clean_html
    assert "tracelab.report.hang" not in clean_xml


class _Text(HTMLParser):
    """Element names and the text of every <dd> of the verdict."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.dd: list[str] = []
        self._in_dd = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self._in_dd = tag == "dd"
        if self._in_dd:
            self.dd.append("")

    def handle_endtag(self, tag: str) -> None:
        self._in_dd = False

    def handle_data(self, data: str) -> None:
        if self._in_dd:
            self.dd[-1] += data


def test_hostile_dump_text_stays_text_in_every_format(store: Path) -> None:
    where = f"{FRAME['name']} at {FRAME['filename']}:7"
    code, html = report(store, "clean", "hostile", "html")
    assert code == 1 and "<script>window.hacked" not in html and "<img" not in html
    parsed = _Text()
    parsed.feed(html)
    assert "img" not in parsed.tags
    # The browser's text is the dump's, exactly: escaped, never interpreted.
    assert OP in parsed.dd and f"rank 0 in {where}" in parsed.dd

    code, md = report(store, "clean", "hostile", "markdown")
    assert code == 1 and "<script>" not in md and "<img" not in md
    bullet = next(line for line in md.splitlines() if line.startswith("- **Collective**"))
    # One line (the newline folded), markup escaped, the pipe escaped.
    assert bullet == (
        "- **Collective**: &lt;script&gt;window.hacked=1&lt;/script&gt;\\]\\]&gt; a\\|b second line"
    )
    stack = next(line for line in md.splitlines() if line.startswith("- **Where"))
    assert "&lt;img src=x onerror=alert(1)&gt;\\|f\\]\\]&gt; at /home/u/tr\\|ain .py:7" in stack

    code, xml = report(store, "clean", "hostile", "junit")
    assert code == 1 and "<script>" not in xml and "]]>" not in xml.split("?>", 1)[1]
    failure = ET.fromstring(xml).find("testsuite/testcase/failure")
    assert failure is not None
    # The parser gives back the dump's text exactly: newlines and all.
    assert failure.get("message") == f"HANG: rank(s) 1 never entered {OP} #5"
    assert f"Collective: {OP}\n" in (failure.text or "")
    assert f"rank 0 in {where}" in (failure.text or "")

    code, out = report(store, "clean", "hostile", "json")
    assert code == 1 and json.loads(out)["hang"]["evidence"]["numbers"]["collective"] == OP


def test_the_hang_outranks_every_other_outcome() -> None:
    """On the comparison model: a pass, a regression or a failed analyzer (exit 3, verdict
    'error') all become exit 1 with verdict 'hang' once the candidate has a hang finding, and
    not otherwise."""
    from dataclasses import replace

    from tests.report.conftest import finding, make_run
    from tracelab.report.compare import compare
    from tracelab.report.thresholds import load_settings

    s = load_settings(search_dir=None)
    hang = replace(finding("HANG", (1,), "rank(s) 1 never entered x #5"), analyzer="hang")
    base = make_run("base", seed=1)
    for slowdown, broken, verdict, code in (
        (1.0, False, "pass", 0),
        (1.2, False, "regression", 1),
        (1.0, True, "error", 3),
    ):
        b = replace(base, errors={"memory": "boom"}) if broken else base
        plain = compare(b, make_run("c", seed=2, slowdown=slowdown), s)
        assert (plain.verdict, plain.exit_code, plain.blocking) == (verdict, code, ())
        hung = compare(b, make_run("c", seed=2, slowdown=slowdown, findings=(hang,)), s)
        assert (hung.verdict, hung.exit_code, hung.blocking) == ("hang", 1, (hang,))
        assert len(hung.regressions) == len(plain.regressions)
    # A hung baseline alone changes nothing.
    assert compare(replace(base, findings=(hang,)), make_run("c", seed=2), s).exit_code == 0
