"""`tracelab hang` on real Flight Recorder dumps (tests/hang/scripts/hang_job.py: torchrun,
gloo, 2 ranks, plain torch): one rank skips a collective, one passes another size, one is killed
mid-step, and a clean run. The dumps are golden fixtures; one case is also captured live."""

from __future__ import annotations

import json
import os
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.foundation.hostile import cli
from tracelab.hang.dumps import read_dumps
from tracelab.hang.verdict import analyze

HERE = Path(__file__).parent
FIX = HERE / "fixtures"

#: case -> (exit code, verdict kind, ranks that entered, ranks absent, seq, op)
EXPECTED = {
    "none": (0, None, None, None, None, None),
    "skip": (1, "not_entered", [0], [1], 5, "gloo:all_reduce"),
    "size": (1, "size_mismatch", [0, 1], [], 5, "gloo:all_reduce"),
    "kill": (1, "missing_rank", [0], [1], 5, "gloo:all_reduce"),
}


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_verdict_on_real_dumps(case: str) -> None:
    code, kind, entered, absent, seq, op = EXPECTED[case]
    res = cli("hang", str(FIX / case), "--format", "json")
    assert res.code == code, res.err
    doc = json.loads(res.out)
    assert doc["hang"] is (code == 1)
    if kind is None:
        assert doc["verdict"] is None
        return
    v = doc["verdict"]
    assert (v["kind"], v["seq"], v["op"]) == (kind, seq, op)
    assert sorted(map(int, v["entered"])) == entered
    assert sorted(map(int, v["absent"])) == absent
    assert v["members"] == [0, 1]


def test_the_text_names_the_rank_and_the_collective_first() -> None:
    res = cli("hang", str(FIX / "skip"))
    first = res.out.splitlines()[0]
    assert res.code == 1 and first == "HANG: rank(s) 1 never entered gloo:all_reduce #5"
    assert "rank 1 last entered #4 gloo:all_reduce" in res.out
    # The stack where the rank waits, from the first frame outside PyTorch.
    assert "at main (" in res.out and "hang_job.py:69)" in res.out
    size = cli("hang", str(FIX / "size")).out
    assert "rank 0 entered #5 gloo:all_reduce [1024] Float" in size
    assert "rank 1 entered #5 gloo:all_reduce [512] Float" in size


@pytest.mark.parametrize("case", ["none", "skip"])
def test_json_and_pickle_dumps_give_the_same_verdict(case: str) -> None:
    as_json = analyze(read_dumps(sorted((FIX / case).glob("*.json"))))
    as_pickle = analyze(read_dumps(sorted((FIX / case).glob("*.pkl"))))

    def key(report):  # the verdict; the stacks are the pickle form's alone
        return [
            (d.kind, d.pg, d.seq, d.op, sorted(d.entered), sorted(d.absent))
            for d in report.divergences
        ]

    assert key(as_json) == key(as_pickle)
    assert all(not d.has_stacks for d in as_json.dumps)
    assert all(d.has_stacks for d in as_pickle.dumps)


def _fr_trace_summary(folder: Path) -> dict[str, object]:
    """PyTorch's own analyzer on a folder of pickle dumps named fr_trace_rank_N."""
    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder),
         "--prefix", "fr_trace_rank_"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    text = out.stdout + out.stderr  # it reports through logging
    found = re.search(r"sequence number: (\d+)", text)
    if found is None:
        return {}
    missing = re.search(r"missing ranks: \{([\d, ]*)\}", text)
    op = re.search(r"collective: (\S+)", text)
    return {
        "seq": int(found.group(1)),
        "missing": sorted(int(x) for x in (missing.group(1) if missing else "").split(",") if x),
        "op": op.group(1) if op else None,
    }


@pytest.mark.parametrize("case", ["none", "skip"])
def test_agrees_with_pytorchs_fr_trace(tmp_path: Path, case: str) -> None:
    """Where PyTorch's fr_trace reads the dumps, both name the same collective and ranks.
    fr_trace (torch 2.13) fails on these gloo dumps as they are (pg_config names the default
    group '' while its entries say '0': KeyError), so the copies it reads name it '0'."""
    for path in sorted((FIX / case).glob("*.pkl")):
        doc = pickle.loads(path.read_bytes())
        doc["pg_config"] = {"0": {**doc["pg_config"][""], "name": "0", "desc": "default_pg"}}
        rank = re.search(r"(\d+)", path.stem).group(1)
        (tmp_path / f"fr_trace_rank_{rank}").write_bytes(pickle.dumps(doc))
    theirs = _fr_trace_summary(tmp_path)
    ours = analyze(read_dumps([tmp_path])).divergences
    if not theirs:
        assert not ours
        return
    assert ours and ours[0].seq == theirs["seq"] and ours[0].op == theirs["op"]
    assert sorted(ours[0].absent) == theirs["missing"]


def test_a_pickle_that_would_run_code_is_refused(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'pwned'}",))

    (tmp_path / "rank_0.pkl").write_bytes(pickle.dumps({"entries": [Evil()]}))
    res = cli("hang", str(tmp_path))
    assert res.code == 3 and "rank_0.pkl" in res.err and "not a plain value" in res.err
    assert not (tmp_path / "pwned").exists()


def test_unreadable_and_unnamed_dumps(tmp_path: Path) -> None:
    (tmp_path / "rank_0.json").write_text('{"entries": [')
    res = cli("hang", str(tmp_path / "rank_0.json"))
    assert res.code == 3 and "rank_0.json" in res.err
    (tmp_path / "dump.json").write_text('{"entries": []}')
    res = cli("hang", str(tmp_path / "dump.json"))
    assert res.code == 2 and "which rank" in res.err
    res = cli("hang", str(tmp_path / "nowhere"))
    assert res.code == 2


def test_text_from_dumps_is_escaped(tmp_path: Path) -> None:
    for r in (0, 1):
        doc = json.loads((FIX / "skip" / f"rank_{r}.json").read_text())
        for e in doc["entries"]:
            e["profiling_name"] = "gloo:all_reduce\x1b[2J\x07"
        (tmp_path / f"rank_{r}.json").write_text(json.dumps(doc))
    res = cli("hang", str(tmp_path))
    assert res.code == 1 and "\x1b" not in res.out and "\x07" not in res.out


@pytest.mark.torchrun
def test_live_capture_of_a_rank_that_skips_a_collective(tmp_path: Path) -> None:
    out = tmp_path / "dumps"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(HERE / "scripts" / "hang_job.py"), "--fault", "skip", "--out", str(out),
         "--timeout-s", "4"],
        env=env, capture_output=True, timeout=180,
    )  # fmt: skip
    res = cli("hang", str(out), "--format", "json")
    assert res.code == 1, res.err
    v = json.loads(res.out)["verdict"]
    assert (
        v["kind"] == "not_entered" and list(v["absent"]) == ["1"] and v["op"] == "gloo:all_reduce"
    )


@pytest.mark.torchrun
def test_the_collector_dumps_when_a_collective_times_out(tmp_path: Path) -> None:
    out = tmp_path / "capture"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
         str(HERE / "scripts" / "collector_hang.py"), "--out", str(out)],
        env=env, capture_output=True, timeout=180,
    )  # fmt: skip
    dumps = out / "flight-recorder"
    assert sorted(p.name for p in dumps.iterdir()) == ["rank_0.json", "rank_0.pkl"]
    res = cli("hang", str(dumps), "--format", "json")
    assert res.code == 1, res.err
    v = json.loads(res.out)["verdict"]
    # Rank 1 ended its loop cleanly without the collective, so it left no dump: the verdict
    # names it as the rank the others wait for, in the all-reduce rank 0 entered.
    assert v["kind"] == "missing_rank" and list(v["absent"]) == ["1"]
    assert v["op"] == "gloo:all_reduce"


def _edited(tmp_path: Path, case: str, edit) -> Path:
    """A copy of a fixture's JSON dumps, `edit(rank, doc)` applied to each."""
    for r in (0, 1):
        doc = json.loads((FIX / case / f"rank_{r}.json").read_text())
        edit(r, doc)
        (tmp_path / f"rank_{r}.json").write_text(json.dumps(doc))
    return tmp_path


def test_dumps_that_disagree_on_a_groups_ranks_are_refused(tmp_path: Path) -> None:
    """The first dump to list a group decided its members: rank 0's dump listing the default
    group as [0] made the job one rank wide, and rank 1, which never entered #5, vanished
    ("OK: the ranks' dumps agree", exit 0)."""

    def edit(rank: int, doc: dict) -> None:
        if rank == 0:
            doc["pg_config"][""]["ranks"] = "[0]"

    res = cli("hang", str(_edited(tmp_path, "skip", edit)))
    assert res.code == 3 and "disagree on the ranks of process group" in res.err, res.err
    assert "rank_0.json" in res.err and "rank_1.json" in res.err


@pytest.mark.parametrize(
    "field, value",
    [
        ("input_sizes", [["x"]]),
        ("input_sizes", [[[1]]]),
        ("time_created_ns", "soon"),
    ],
)
def test_malformed_values_in_a_dump_name_the_file(tmp_path: Path, field: str, value) -> None:
    """They were an internal error (exit 70) that named no file, or sorted text with numbers."""

    def edit(rank: int, doc: dict) -> None:
        if rank == 1:
            doc["entries"][0][field] = value

    res = cli("hang", str(_edited(tmp_path, "skip", edit)))
    assert "Traceback" not in res.err and "internal error" not in res.err, res.err
    if field == "time_created_ns":  # not a number: read as unknown, the verdict stands
        assert res.code == 1 and "never entered gloo:all_reduce #5" in res.out, res.err
    else:
        assert res.code == 3 and "rank_1.json" in res.err and "malformed value" in res.err


def test_a_group_with_ranks_that_are_not_numbers_names_the_file(tmp_path: Path) -> None:
    def edit(rank: int, doc: dict) -> None:
        doc["pg_config"][""]["ranks"] = ["a", "b"]

    res = cli("hang", str(_edited(tmp_path, "skip", edit)))
    assert res.code == 3 and "rank_0.json" in res.err and "malformed value" in res.err, res.err


def test_a_dump_nested_too_deep_is_unreadable_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "rank_0.json").write_text('{"entries": ' + "[" * 200_000 + "]" * 200_000 + "}")
    res = cli("hang", str(tmp_path / "rank_0.json"))
    assert res.code == 3 and "rank_0.json" in res.err and "Traceback" not in res.err, res.err


def test_a_dump_version_tracelab_does_not_know_is_said(tmp_path: Path) -> None:
    def edit(rank: int, doc: dict) -> None:
        if rank == 1:
            doc["version"] = "99.0"

    res = cli("hang", str(_edited(tmp_path, "skip", edit)))
    assert res.code == 1, res.err
    assert "rank(s) 1 wrote dump format version 99.0" in res.out
    assert "format version" not in cli("hang", str(FIX / "skip")).out


def _three_ranks(tmp_path: Path, edit) -> Path:
    """The skip fixture's rank 0 dump as ranks 0-2 of one group, `edit(rank, doc)` applied."""
    base = json.loads((FIX / "skip" / "rank_0.json").read_text())
    for r in range(3):
        doc = json.loads(json.dumps(base))
        doc["pg_config"][""]["ranks"] = "[0, 1, 2]"
        edit(r, doc)
        (tmp_path / f"rank_{r}.json").write_text(json.dumps(doc))
    return tmp_path


def _last_seq(doc: dict) -> int:
    return max(e["collective_seq_id"] for e in doc["entries"] if not e["is_p2p"])


def test_ranks_that_entered_but_disagree_are_a_desync_not_a_missing_rank(tmp_path: Path) -> None:
    """Dumps of two jobs mixed: at the last number rank 2 has no entry and ranks 0 and 1
    disagree on the sizes. That read "rank(s) 2 never entered"; the ranks that did enter
    disagree, which says more."""

    def edit(rank: int, doc: dict) -> None:
        last = _last_seq(doc)
        if rank == 2:
            doc["entries"] = [e for e in doc["entries"] if e["collective_seq_id"] != last]
        if rank == 1:
            for e in doc["entries"]:
                if e["collective_seq_id"] == last:
                    e["input_sizes"] = e["output_sizes"] = [[7]]

    res = cli("hang", str(_three_ranks(tmp_path, edit)), "--format", "json")
    v = json.loads(res.out)["verdict"]
    assert res.code == 1 and v["kind"] == "size_mismatch", res.out
    assert sorted(map(int, v["entered"])) == [0, 1] and list(v["absent"]) == ["2"]


def test_an_all_to_all_with_uneven_splits_is_no_size_mismatch(tmp_path: Path) -> None:
    """Each rank passes its own split sizes to an all-to-all: different input sizes are no
    desync; rank 2 that never entered is the verdict."""

    def edit(rank: int, doc: dict) -> None:
        last = _last_seq(doc)
        for e in doc["entries"]:
            if e["collective_seq_id"] == last:
                e["profiling_name"] = "gloo:all_to_all"
                e["input_sizes"] = [[8 + rank]]
        if rank == 2:
            doc["entries"] = [e for e in doc["entries"] if e["collective_seq_id"] != last]

    res = cli("hang", str(_three_ranks(tmp_path, edit)), "--format", "json")
    v = json.loads(res.out)["verdict"]
    assert res.code == 1 and v["kind"] == "not_entered" and list(v["absent"]) == ["2"], res.out


@pytest.mark.parametrize("op", ["gloo:gather", "gloo:scatter", "gloo:reduce_scatter"])
def test_a_rank_missing_from_an_op_whose_sizes_may_differ_is_the_hang(
    tmp_path: Path, op: str
) -> None:
    """A gather's root records the gathered tensor and the other ranks none (a real gloo
    gather: [[3, 16]] against []): a rank that never entered it is the verdict, not a desync;
    and with every rank in, no desync either."""

    def edit(rank: int, doc: dict, *, drop: bool) -> None:
        last = _last_seq(doc)
        for e in doc["entries"]:
            if e["collective_seq_id"] == last:
                e["profiling_name"] = op
                e["output_sizes"] = [[3, 16]] if rank == 0 else []
        if drop and rank == 2:
            doc["entries"] = [e for e in doc["entries"] if e["collective_seq_id"] != last]

    res = cli(
        "hang", str(_three_ranks(tmp_path, lambda r, d: edit(r, d, drop=True))), "--format", "json"
    )
    v = json.loads(res.out)["verdict"]
    assert res.code == 1 and v["kind"] == "not_entered" and list(v["absent"]) == ["2"], res.out
    every = tmp_path / "every"
    every.mkdir()
    res = cli("hang", str(_three_ranks(every, lambda r, d: edit(r, d, drop=False))))
    if op == "gloo:reduce_scatter":  # every rank passes the same shapes: a desync
        assert res.code == 1 and "different tensor sizes" in res.out, res.out
    else:
        assert res.code == 0 and "agree" in res.out, res.out


#: 4-rank cases (tests/hang/scripts/hang_job4.py): case -> (exit code, kind, entered, absent
#: with a dump, ranks without one, process group, op)
EXPECTED_4 = {
    "subgroups": (0, None, None, None, None, None, None),
    "skip_killed": (1, "not_entered", [0, 2], [3], [1], "0", "gloo:all_reduce"),
    "size_killed": (1, "size_mismatch", [0, 2, 3], [], [1], "0", "gloo:all_reduce"),
    "a2a_dtype": (1, "dtype_mismatch", [0, 1, 2, 3], [], [], "0", "gloo:all_to_all"),
}


@pytest.mark.parametrize("form", ["json", "pkl"])
@pytest.mark.parametrize("case", sorted(EXPECTED_4))
def test_verdict_on_real_4_rank_dumps(tmp_path: Path, case: str, form: str) -> None:
    """Each form alone (the pickle form names a group by a tuple, the JSON form by a list):
    - two groups of different ranks with the same local index (pg_id) agree: they were read as
      one group whose ranks passed different sizes (a desync on a healthy job);
    - a rank killed by the others' timeout (no dump) no longer hides the rank that never entered,
      nor the rank that passed another size;
    - an all-to-all whose ranks pass different dtypes is a desync (its sizes may differ, its
      element type may not)."""
    code, kind, entered, absent, no_dump, pg, op = EXPECTED_4[case]
    for path in (FIX / f"4ranks_{case}").glob(f"*.{form}"):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    res = cli("hang", str(tmp_path), "--world-size", "4", "--format", "json")
    assert res.code == code, res.out + res.err
    v = json.loads(res.out)["verdict"]
    if kind is None:
        assert v is None
        return
    assert (v["kind"], v["process_group"], v["op"]) == (kind, pg, op)
    assert sorted(map(int, v["entered"])) == entered
    assert sorted(int(r) for r, e in v["absent"].items() if e is not None) == absent
    assert sorted(int(r) for r, e in v["absent"].items() if e is None) == no_dump
    text = cli("hang", str(tmp_path), "--world-size", "4").out.splitlines()[0]
    if no_dump:
        assert text.endswith("; rank(s) 1 left no dump"), text
    if absent:
        assert text.startswith("HANG: rank(s) 3 never entered gloo:all_reduce #"), text


def test_an_ok_verdict_says_which_sizes_it_did_not_compare() -> None:
    res = cli("hang", str(FIX / "4ranks_subgroups"))
    assert res.code == 0
    assert "Not compared, as they differ by rank in a well-formed job: the first dimension of " \
        "all_to_all tensors (its splits)." in res.out  # fmt: skip
    assert "Not compared" not in cli("hang", str(FIX / "none")).out


@pytest.mark.parametrize(
    "field, value, said",
    [
        ("is_p2p", "yes", "is_p2p is 'yes'"),
        ("collective_seq_id", -5, "sequence number is -5"),
        ("collective_seq_id", 10**30, "outside 0..2^63-1"),
        ("collective_seq_id", True, "no sequence number"),
    ],
)
def test_a_flag_or_sequence_number_of_the_wrong_kind_is_refused(
    tmp_path: Path, field: str, value, said: str
) -> None:
    """They were read (`"yes"` as a p2p op, -5 as a number before every other) and moved the
    verdict onto rank 0; docs/hang.md says a value of the wrong kind is refused."""

    def edit(rank: int, doc: dict) -> None:
        if rank == 1:
            doc["entries"][0][field] = value

    res = cli("hang", str(_edited(tmp_path, "skip", edit)))
    assert res.code == 3 and "rank_1.json" in res.err and said in res.err, res.err
    assert "Traceback" not in res.err
