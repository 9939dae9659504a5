"""tracelab.memory_model against Korthikanti et al. 2022 ("Reducing Activation Recomputation in
Large Transformer Models", arXiv 2205.05198): Table 2's per-layer activation formulas, the
first pipeline stage's total (section 4.2.3: p microbatches of L/p layers = L layers' worth;
4.3: plus the embedding dropout's s*b*h*p/t), the interleaving factor 1 + (p-1)/(p*v), on the
paper's Table 3 configurations (sequence 2048, vocabulary 51200, micro-batch 1, t = 8).
"""

from __future__ import annotations

import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from tracelab import memory_model as mm

# Table 3: name -> (heads a, hidden h, layers L, tensor t, pipeline p).
TABLE3 = {
    "22B": (64, 6144, 48, 8, 1),
    "175B": (96, 12288, 96, 8, 8),
    "530B": (128, 20480, 105, 8, 35),
    "1T": (160, 25600, 128, 8, 64),
}
S, B, V = 2048, 1, 51200


@pytest.mark.parametrize("name", sorted(TABLE3))
def test_table2_per_layer(name: str) -> None:
    a, h, _, t, _ = TABLE3[name]
    sbh = S * B * h
    att = Fraction(5 * a * S, h)
    exact = {
        ("none", 1, False): sbh * (34 + att),
        ("none", t, False): sbh * (10 + Fraction(24, t) + att / t),
        ("none", t, True): sbh * (34 + att) / t,
        ("selective", t, False): sbh * (10 + Fraction(24, t)),
        ("selective", t, True): sbh * Fraction(34, t),
        ("full", 1, False): 2 * sbh,
    }
    for (rec, tt, sp), want in exact.items():
        got = mm.activation_bytes_per_layer(s=S, b=B, h=h, a=a, t=tt, sp=sp, recompute=rec)
        assert got == pytest.approx(float(want), rel=1e-12), (rec, tt, sp)


@pytest.mark.parametrize("name", ["175B", "530B", "1T"])
def test_first_stage_1f1b_holds_L_layers(name: str) -> None:
    """p > 1: the first stage stores s*b*h*L/t*(34 + 5as/h) + s*b*h*p/t (paper 4.2.3, 4.3)."""
    a, h, L, t, p = TABLE3[name]
    cfg = mm.ModelConfig(
        layers=L,
        hidden=h,
        seq=S,
        microbatch=B,
        heads=a,
        vocab=V,
        microbatches=2 * p,
        tp=t,
        pp=p,
        sp=True,
    )
    first = mm.predict(cfg)[0]
    want = S * B * h * L / t * (34 + 5 * a * S / h) + S * B * h * p / t
    assert first.in_flight == {0: p}
    assert first.activations_bytes == pytest.approx(want, rel=1e-12)


def test_22b_without_pipeline_adds_the_output_layer() -> None:
    """p = 1: plus 4*s*b*h/t*(1 + v/h) for the final LayerNorm, output layer and fp32 logits."""
    a, h, L, t, p = TABLE3["22B"]
    cfg = mm.ModelConfig(
        layers=L, hidden=h, seq=S, microbatch=B, heads=a, vocab=V, tp=t, pp=p, sp=True
    )
    want = S * B * h * L / t * (34 + 5 * a * S / h + p / L + 4 / L * (1 + V / h))
    assert mm.predict(cfg)[0].activations_bytes == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("p,v", [(4, 2), (8, 2), (8, 3)])
def test_interleaved_replay_gives_the_papers_factor(p: int, v: int) -> None:
    """Replaying the interleaved order, rank 0 holds L*(1 + (p-1)/(p*v)) layers' worth."""
    per_stage = 1000.0
    stage_bytes = {k: per_stage for k in range(p * v)}
    held = mm.peak_in_flight("interleaved_1f1b", p, 4 * p, v, stage_bytes)
    layers_worth = held[0][0] / per_stage / v  # in units of one rank's whole layers
    assert layers_worth == pytest.approx(p * mm.interleave_factor(p, v))


@pytest.mark.parametrize("p,m", [(4, 8), (4, 2), (8, 16)])
def test_1f1b_in_flight_is_min_m_p_minus_s(p: int, m: int) -> None:
    held = mm.peak_in_flight("1f1b", p, m, 1, {k: 1.0 for k in range(p)})
    assert [held[s][1] for s in range(p)] == [{s: min(m, p - s)} for s in range(p)]


def test_unbalanced_stages_weigh_what_they_hold() -> None:
    held = mm.peak_in_flight("1f1b", 4, 8, 1, {0: 4.0, 1: 2.0, 2: 2.0, 3: 1.0})
    assert [held[s][0] for s in range(4)] == [16.0, 6.0, 4.0, 1.0]


def test_model_states_2_2_12_sharded() -> None:
    assert mm.model_state_bytes(1e9) == (2e9, 2e9, 12e9)
    assert mm.model_state_bytes(1e9, zero=1, dp=4) == (2e9, 2e9, 3e9)
    assert mm.model_state_bytes(1e9, zero=2, dp=4) == (2e9, 0.5e9, 3e9)
    assert mm.model_state_bytes(1e9, zero=3, dp=4) == (0.5e9, 0.5e9, 3e9)


def test_schedule_without_count_is_an_error() -> None:
    with pytest.raises(ValueError, match="no in-flight count"):
        mm.peak_in_flight("mystery", 4, 8, 1, {0: 1.0})


def test_config_names_a_bad_key() -> None:
    with pytest.raises(ValueError, match="unknown key"):
        mm.config_from_mapping({"layers": 2, "hiden": 8})


def test_estimate_command(tmp_path) -> None:
    cfg = tmp_path / "c.json"
    cfg.write_text(
        '{"layers": 96, "hidden": 12288, "seq": 2048, "microbatch": 1, "heads": 96, '
        '"vocab": 51200, "microbatches": 16, "tp": 8, "pp": 8, "sp": true}'
    )
    out = subprocess.run(
        [sys.executable, "-m", "tracelab.cli", "estimate", str(cfg), "--format", "csv"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert out[0].startswith("pp_rank,stages,in_flight")
    first = dict(zip(out[0].split(","), out[1].split(",")))
    # 175B first stage, 1F1B: 32.086 GiB of activations (p = 8 microbatches of 12 layers).
    assert first["activations_GiB"] == "32.086"
    fits = subprocess.run(
        [sys.executable, "-m", "tracelab.cli", "estimate", str(cfg), "--capacity-gib", "80"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "of_capacity" in fits and "(does not fit)" not in fits.splitlines()[2]
    bad = subprocess.run(
        [sys.executable, "-m", "tracelab.cli", "estimate", "--layers", "2"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "--hidden" in bad.stderr


def test_run_without_collector_data_says_what_is_missing(analyzed) -> None:
    """A pipelined capture whose collector counted no model states gets no estimate, and the
    note names the missing input and how to capture it (never a guess)."""
    _, results = analyzed("pipeline", schedule="1f1b", p=4, m=8, capture=True)
    mem = results["memory"]
    assert mem.tables["estimate"] == []
    note = next(n for n in mem.notes if n.startswith("no memory estimate"))
    assert "model-state bytes" in note and "optimizer=" in note
    assert not any(f.code == "MEMORY_ESTIMATE_MISMATCH" for f in mem.findings)


@pytest.mark.parametrize(
    "schedule,p,v,want",
    [
        ("gpipe", 4, 1, [8, 8, 8, 8]),  # every stage holds all m
        ("zb_h1", 4, 1, [4, 3, 2, 1]),  # 1F1B's memory limit
        ("zbv", 4, 2, [8, 8, 8, 8]),  # 2p chunks on every rank
        ("dualpipev", 4, 2, [10, 10, 10, 10]),  # PP + 1 microbatches of a rank: 2(p + 1) chunks
        ("looped_bfs", 4, 2, [16, 16, 16, 16]),
    ],
)
def test_in_flight_counts_per_schedule(schedule: str, p: int, v: int, want: list[int]) -> None:
    m = 8
    held = mm.peak_in_flight(schedule, p, m, v, {k: 1.0 for k in range(p * v)})
    assert [held[r][0] for r in range(p)] == [float(n) for n in want]


@pytest.mark.parametrize("optimizer", ["adam", "adam_fp32", "sgd", "sgd_momentum"])
def test_optimizer_workspace_is_one_fp32_moment_per_parameter(optimizer: str) -> None:
    """Foreach Adam's sqrt(v): 4 bytes per parameter on the rank's optimizer shard, for mixed
    precision too (its 12 optimizer bytes hold fp32 master weights, m and v; the workspace was
    taken as half of all 12, 6 bytes a parameter: 43.1 GiB against 24.8 at 6.66e9 params)."""
    cfg = mm.config_from_mapping(
        {"layers": 4, "hidden": 1024, "seq": 2048, "microbatch": 1, "heads": 16}
        | {"optimizer": optimizer, "dp": 4, "zero": 1}
    )
    (rank,) = mm.predict(cfg)
    params = mm.stage_params(cfg)[0]
    want = 4.0 * params / 4 if optimizer.startswith("adam") else 0.0
    assert rank.optimizer_workspace_bytes == pytest.approx(want, rel=1e-12)


SHAPE = ["--layers", "4", "--hidden", "1024", "--seq", "2048", "--microbatch", "1", "--heads", "16"]


@pytest.mark.parametrize(
    "name, text, words",
    [
        ("trunc.json", '{"layers": 4,\n', "not a JSON mapping"),
        ("bad.yaml", "layers: [4\n", "not a YAML mapping"),
        ("list.json", "[1, 2]", "must be a mapping"),
        ("sp.json", '{"sp": "false"}', "sp must be true or false"),
        ("lps.json", '{"layers_per_stage": 5}', "must be a list of integers"),
        ("bin.json", b"\xff\xfe", "cannot read the config"),
        ("zero.json", '{"zero": 7}', "zero must be 0, 1, 2 or 3"),
        ("sched.yaml", "schedule: foo\n", "schedule must be one of"),
        # a stage of no (or fewer than no) layers: its rank was shown holding nothing, or
        # -0.012 GiB
        ("neg.yaml", "pp: 2\nlayers_per_stage: [5, -1]\n", "at least one layer, not [5, -1]"),
        ("none.yaml", "pp: 2\nlayers_per_stage: [4, 0]\n", "at least one layer, not [4, 0]"),
    ],
)
def test_a_config_file_that_cannot_be_used_names_it(tmp_path, name, text, words) -> None:
    """Each was a usage error (exit 2) without the file's name, or an internal error (exit 70):
    "sp": "false" was read as true, layers_per_stage 5 crashed."""
    from tests.foundation.hostile import cli

    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    res = cli("estimate", str(path), *SHAPE)
    assert res.code == 3 and str(path) in res.err and words in res.err, res.err
    assert "Traceback" not in res.err and "internal error" not in res.err


def test_flags_complete_a_partial_config_file(tmp_path) -> None:
    from tests.foundation.hostile import cli

    path = tmp_path / "part.json"
    path.write_text('{"layers": 4, "hidden": 1024, "seq": 2048, "microbatch": 1}')
    assert cli("estimate", str(path), "--heads", "16").code == 0
    res = cli("estimate", str(path))
    assert res.code == 2 and "missing --heads" in res.err, res.err


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--zero", "4"], "zero must be 0, 1, 2 or 3"),
        (["--zero", "-1"], "zero must be 0, 1, 2 or 3"),
        (["--capacity-gib", "0"], "--capacity-gib must be above 0"),
        (["--schedule", "foo"], "schedule must be one of"),
        (["--pp", "2", "--v", "3", "--microbatches", "8", "--schedule", "zbv"], "v must be 2"),
        (
            ["--pp", "2", "--v", "1", "--microbatches", "8", "--schedule", "dualpipev"],
            "v must be 2",
        ),
        (["--pp", "4", "--microbatches", "1000000"], "microbatches must be at most 65,536"),
        # fewer layers than stages: the empty stages' ranks were listed holding nothing
        (["--layers", "2", "--pp", "4", "--microbatches", "8"], "cannot fill the pipeline's 4"),
        (["--layers", "4", "--pp", "4", "--v", "2", "--microbatches", "8"], "8 stages"),
    ],
)
def test_values_that_cannot_run_are_usage_errors(extra, words) -> None:
    """They were taken as they came: ZeRO 4 as 3, a capacity of 0 ignored, zbv with v = 3
    estimated as v = 2 (stages 4 and 5 mapped to ranks -1 and -2: their memory dropped)."""
    from tests.foundation.hostile import cli

    res = cli("estimate", *SHAPE, *extra)
    assert res.code == 2 and words in res.err, res.err


def test_analyze_refuses_a_prediction_it_cannot_read(tmp_path) -> None:
    """A missing --prediction file was ignored without a word (exit 0)."""
    from tests.foundation.hostile import cli
    from tests.foundation.kineto import run_set
    from tracelab.ingest import ingest

    db = tmp_path / "s.duckdb"
    ingest([run_set(tmp_path / "good")], db=db, run="good", progress=False)
    missing = tmp_path / "nothere.yml"
    res = cli("analyze", "--db", str(db), "--only", "memory", "--prediction", str(missing))
    assert res.code == 3 and str(missing) in res.err, res.err
    partial = tmp_path / "part.yml"
    partial.write_text("layers: 4\n")
    res = cli("analyze", "--db", str(db), "--only", "memory", "--prediction", str(partial))
    assert res.code == 3 and "missing setting" in res.err, res.err


def test_a_run_without_a_pipeline_says_why_it_has_no_estimate(tmp_path) -> None:
    """An FSDP2 capture (sample_traces/fsdp2, 4 ranks, no pipeline) got an empty estimate table
    and no word why, and `--prediction` was dropped without one."""
    from tests.foundation.hostile import cli

    repo = Path(__file__).resolve().parents[2]
    db = tmp_path / "s.duckdb"
    assert cli("ingest", str(repo / "sample_traces" / "fsdp2"), "--db", str(db)).code == 0
    pred = tmp_path / "pred.yaml"
    pred.write_text("layers: 4\nhidden: 256\nseq: 64\nmicrobatch: 1\nheads: 4\n")
    res = cli("analyze", "--db", str(db), "--only", "memory", "--format", "json",
              "--prediction", str(pred))  # fmt: skip
    assert res.code == 0, res.err
    mem = json.loads(res.out)["analyzers"]["memory"]
    assert mem["tables"]["estimate"] == []
    (note,) = [n for n in mem["notes"] if n.startswith("no memory estimate")]
    assert "this run has no pipeline" in note
    assert f"--prediction {pred} is not compared" in note
