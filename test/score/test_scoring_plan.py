"""The scoring plan (spkflow.score.scoring_plan, spkflow.bin.scoring_plan): the sets stages 1 and 5 use
and stage 6's steps, from spk.sh's options and the files on disk; its steps run as real processes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from spkflow.score.scoring_plan import PlanError, ScoringOptions, ScoringPlan, Step, run_plan, stage6

DEMO = dict(  # egs/speechocean762/spk1/run.sh's scoring options
    exp="exp/spk_demo",
    test_sets=("test", "dsp20", "dsp20_8k"),
    valid_set="test",
    calib_set="dsp20_8k",
    score_backend="wccn",
    score_norm=True,
    cohort_size=25,
)


def _recipe(root, train=True, sets=("test", "dsp20", "dsp20_8k")):
    """The files stages 1 and 5 leave: data/<set>/trials, exp/spk_demo/embed/<set>/xvector.scp."""
    for name in sets:
        (root / "data" / name).mkdir(parents=True)
        (root / "data" / name / "trials").write_text("a b target\n")
        (root / "exp" / "spk_demo" / "embed" / name).mkdir(parents=True)
        (root / "exp" / "spk_demo" / "embed" / name / "xvector.scp").write_text("a x.ark:1\n")
    if train:
        (root / "data" / "train").mkdir(parents=True)
        (root / "data" / "train" / "utt2spk").write_text("a s\n")
        for name in ("xvector.scp", "spk_xvector.scp"):
            (root / "exp" / "spk_demo" / "embed" / "train").mkdir(parents=True, exist_ok=True)
            (root / "exp" / "spk_demo" / "embed" / "train" / name).write_text("a x.ark:1\n")


def _commands(plan: ScoringPlan) -> list[list[str]]:
    return [list(s.args) if not s.module else [s.module, *s.args] for s in plan.steps if s.args]


def test_the_calibration_set_is_embedded_once_when_it_is_a_test_set(tmp_path, monkeypatch):
    """The demo scores dsp20_8k and calibrates on it: stage 5 embeds it once (it was listed twice)."""
    monkeypatch.chdir(tmp_path)
    sets, note = ScoringOptions(**DEMO).embed_sets_and_note()
    assert sets == ["train", "test", "dsp20", "dsp20_8k"] and note == ""
    # the command spk.sh calls says the same, on one line
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "spkflow.bin.scoring_plan",
            "--exp",
            "exp/spk_demo",
            "--test_sets",
            "test dsp20 dsp20_8k",
        ]
        + ["--valid_set", "test", "--calib_set", "dsp20_8k", "--score_backend", "wccn", "--score_norm", "true"]
        + ["embed-sets"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout == "train test dsp20 dsp20_8k\n"


@pytest.mark.parametrize(
    ("options", "want"),
    [
        ({}, ["train", "test"]),  # the default calibration: trials drawn from the training set
        ({"calibrate": False}, ["test"]),
        ({"calib_set": "cal"}, ["test", "cal"]),
        ({"calib_set": "cal", "calibrate": False}, ["test"]),
        ({"score_center": True, "calibrate": False}, ["train", "test"]),
        ({"score_qmf": True, "calib_set": "test"}, ["train", "test"]),
        ({"extract_train": True, "embed_sets": ("train", "x", "x")}, ["train", "x"]),
        ({"packed": True, "calib_set": "cal", "score_norm": True}, ["test"]),  # the model brings its scoring
        ({"test_sets": ("a", "b"), "valid_set": "b", "calibrate": False}, ["a", "b"]),
    ],
)
def test_embed_sets(tmp_path, monkeypatch, options, want):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "train").mkdir(parents=True)
    (tmp_path / "data" / "train" / "utt2spk").write_text("a s\n")
    o = ScoringOptions(exp="exp/x", **{"valid_set": "test", **options})
    assert o.embed_sets_and_note() == (want, "")


def test_default_calibration_without_a_training_set(tmp_path, monkeypatch):
    """Another toolkit's model in a recipe with no training set: stage 5 says stage 6 goes without
    the default calibration; stage 6 scores uncalibrated, saying why, and drops an earlier scoring."""
    monkeypatch.chdir(tmp_path)
    _recipe(tmp_path, train=False, sets=("test",))
    o = ScoringOptions(exp="exp/spk_demo", pretrained="m.onnx", test_sets=("test",), valid_set="test")
    sets, note = o.embed_sets_and_note()
    assert sets == ["test"] and "No data/train to embed for stage 6's default calibration" in note
    assert o.data_sets() == ["train", "test"]  # stage 6 would use it: stage 1 checks it
    plan = stage6(o)
    said = [s.say for s in plan.steps if s.say]
    assert any(s.startswith("No calibration (no --calib_set and no utterance embeddings of train") for s in said)
    assert plan.remove == ("exp/spk_demo/scoring.yaml", "exp/spk_demo/scoring.npz")
    assert _commands(plan)[0][0] == "scripts/spk/score.sh" and "--scoring-dir" not in _commands(plan)[0]
    # with training data stage 5 embeds it
    (tmp_path / "data" / "train").mkdir()
    (tmp_path / "data" / "train" / "utt2spk").write_text("a s\n")
    assert o.embed_sets_and_note() == (["train", "test"], "")
    # a pretrained model of ours needs no training set at all
    packed = ScoringOptions(exp="e", pretrained="p.zip", packed=True, test_sets=("test",), calib_set="cal")
    assert packed.data_sets() == ["cal", "test"] and packed.embed_sets_and_note() == (["test"], "")


def test_stage6_of_the_demo(tmp_path, monkeypatch):
    """Backend on the training set, calibration on dsp20_8k through the same backend and cohort,
    every test set scored through the calibrated scoring."""
    monkeypatch.chdir(tmp_path)
    _recipe(tmp_path)
    plan = stage6(ScoringOptions(**DEMO))
    cmds = _commands(plan)
    assert [c[0] for c in cmds] == ["spkflow.bin.fit_backend", "spkflow.bin.calibrate"] + ["scripts/spk/score.sh"] * 3
    cohort = ["--cohort-scp", "exp/spk_demo/embed/train/spk_xvector.scp", "--cohort-size", "25"]
    backend = ["--backend", "exp/spk_demo/backend/wccn.npz"]
    assert cmds[1][1:5] == [
        "--trials",
        "data/dsp20_8k/trials",
        "--xvector-scp",
        "exp/spk_demo/embed/dsp20_8k/xvector.scp",
    ]
    assert cmds[1][5:11] == [*cohort, *backend]
    for cmd, name in zip(cmds[2:], DEMO["test_sets"], strict=True):
        assert "--scoring-dir" in cmd and "--backend" not in cmd and "--cohort-scp" not in cmd
        assert cmd[-3:] == [
            f"data/{name}/trials",
            f"exp/spk_demo/embed/{name}/xvector.scp",
            f"exp/spk_demo/eval/{name}",
        ]
    assert plan.remove == () and plan.results == "exp/spk_demo/RESULTS.md"
    # not calibrated: the test sets are scored with the backend and cohort themselves
    plain = stage6(ScoringOptions(**{**DEMO, "calibrate": False}))
    cmds = _commands(plain)
    assert [c[0] for c in cmds] == ["spkflow.bin.fit_backend"] + ["scripts/spk/score.sh"] * 3
    assert all(c[c.index("--cohort-scp") :][:4] == cohort and "--scoring-dir" not in c for c in cmds[1:])
    script = plain.script()
    assert script.startswith("rm -f exp/spk_demo/scoring.yaml\n") and "# No calibration (--calibrate false)" in script
    assert "fit_backend --backend wccn --reg 0.1" in script and "> exp/spk_demo/backend/log/fit_wccn.log 2>&1" in script


def test_stage6_default_calibration_and_qmf(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _recipe(tmp_path, sets=("test",))
    (tmp_path / "data" / "train" / "utt2dur").write_text("a 1.0\n")
    o = ScoringOptions(exp="exp/spk_demo", test_sets=("test",), valid_set="test", score_qmf=True, qmf_trials=50)
    cmds = _commands(stage6(o))
    assert [c[0] for c in cmds] == ["spkflow.bin.make_trials", "spkflow.bin.calibrate", "spkflow.bin.fit_qmf"] + [
        "scripts/spk/score.sh"
    ]
    assert cmds[0][-2:] == ["data/train", "exp/spk_demo/calib/trials"]
    assert cmds[1][cmds[1].index("--set-name") + 1] == "train (seen in training)"
    assert cmds[2][cmds[2].index("--utt2dur") + 1] == "data/train/utt2dur" and "--num-trials" in cmds[2]
    assert cmds[3][cmds[3].index("--qmf") + 1] == "exp/spk_demo/qmf/qmf.json" and "--utt2dur" not in cmds[3]


def test_stage6_with_a_packed_scoring(tmp_path, monkeypatch):
    """A model unpacked into the experiment dir: its scoring, its RESULTS.md kept (the summary
    goes to eval/RESULTS.md); nothing fitted, nothing removed."""
    monkeypatch.chdir(tmp_path)
    _recipe(tmp_path, train=False, sets=("test",))
    (tmp_path / "exp" / "spk_demo" / "scoring.yaml").write_text("scoring: cosine\n")
    o = ScoringOptions(exp="exp/spk_demo", model_dir="exp/spk_demo", packed=True, test_sets=("test",), score_norm=True)
    plan = stage6(o)
    (cmd,) = _commands(plan)
    assert cmd[cmd.index("--scoring-dir") + 1] == "exp/spk_demo"
    assert cmd[cmd.index("--results-file") + 1] == "exp/spk_demo/eval/RESULTS.md" == plan.results
    assert "packed scoring" in plan.steps[0].say and plan.remove == ()
    (tmp_path / "exp" / "spk_demo" / "scoring.yaml").unlink()
    assert "holds no scoring" in stage6(o).steps[0].say and "--scoring-dir" not in _commands(stage6(o))[0]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"score_backend": "plda"}, "--score_backend must be cosine, wccn or lda, got 'plda'"),
        ({"score_backend": "lda", "score_center": True}, "set --score_center false"),
        ({"score_center": True, "score_eval_mean": True}, "not both"),
        ({"packed": True, "score_qmf": True, "model_dir": "m"}, "a pretrained model (m) scores with its own"),
    ],
)
def test_options_that_do_not_go_together(options, message):
    with pytest.raises(PlanError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ScoringOptions(exp="e", **options).check()
    p = subprocess.run(
        [sys.executable, "-m", "spkflow.bin.scoring_plan", "--exp", "e"]
        + [f"--{k}={v if not isinstance(v, bool) else str(v).lower()}" for k, v in options.items() if k != "packed"]
        + (["--packed_scoring", "true"] if options.get("packed") else [])
        + ["check"],
        capture_output=True,
        text=True,
    )
    assert p.returncode == 2 and message in p.stdout and "Traceback" not in p.stderr


def test_a_missing_cohort_is_named_before_anything_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(PlanError, match=r"exp/x/embed/train/spk_xvector.scp: run stage 5 with the same options"):
        stage6(ScoringOptions(exp="exp/x", score_norm=True))


def test_run_plan_runs_real_steps_and_stops_at_the_first_failure(tmp_path, monkeypatch, capsys):
    """Each step's output goes to its log; a failure shows the log's last lines, names the log,
    and nothing after it runs; a file a step needs is checked right before it runs."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "d").mkdir(parents=True)
    (tmp_path / "data" / "d" / "utt2spk").write_text("".join(f"s{i}-u{j} s{i}\n" for i in range(3) for j in range(2)))
    said: list[str] = []
    ok = Step(say="trials", module="spkflow.bin.make_trials", args=("data/d", "t/trials"), log="t/log/a.log")
    echo = Step(module="spkflow.bin.make_trials", args=("data/d", "t/trials2"), log="t/log/b.log", echo=r"\d+ target")
    bad = Step(module="spkflow.bin.make_trials", args=("data/none", "t/x"), log="t/log/c.log", error="it failed")
    never = Step(say="never said", args=("false",))
    (tmp_path / "stale").write_text("old\n")
    with pytest.raises(PlanError, match=r"it failed, see t/log/c.log"):
        run_plan(ScoringPlan((ok, echo, bad, never), remove=("stale", "absent")), say=said.append)
    assert not (tmp_path / "stale").exists()
    assert (tmp_path / "t" / "trials").read_text().count(" target") == 3 and (
        tmp_path / "t" / "log" / "a.log"
    ).is_file()
    assert said[0] == "trials" and said[1:] and all("target" in s for s in said[1:]) and "never said" not in said
    assert "data/none/utt2spk" in capsys.readouterr().err  # the failed step's last log lines
    needs = Step(say="x", args=("true",), needs=("t/trials", "t/missing"), needs_why="stage 5 writes it")
    with pytest.raises(PlanError, match=r"^t/missing not found \(stage 5 writes it\)$"):
        run_plan(ScoringPlan((needs,)), say=said.append)
    with pytest.raises(PlanError, match="false failed"):
        run_plan(ScoringPlan((never,)), say=said.append)
