"""Speaker identification: the split rule, the metrics, the LDA backend (spkflow/score/sid.py), and the
SID recipe (egs/speechocean762/sid1: sid.sh stages 5-8) end to end on real speechocean762 and
DSPSpeech-20 audio with a small model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import kaldiio
import numpy as np
import pytest
import yaml

from helpers.paths import ROOT
from helpers.recipes import linked_recipe
from helpers.spread import within
from spkflow.core.errors import InputError
from spkflow.score.backend import fit_backend
from spkflow.score.sid import (
    closed_set,
    enrol,
    make_split,
    open_set,
    read_split,
    threshold_at_far,
    top_k_accuracy,
    write_split,
)

PY = Path(sys.executable)


# ----------------------------------------------------------------------------- library


def spk2utt_of(num_spk: int, num_utt: int, prefix: str = "s") -> dict[str, list[str]]:
    return {f"{prefix}{s:02d}": [f"{prefix}{s:02d}-u{u:02d}" for u in range(num_utt)] for s in range(num_spk)}


def test_split_is_seeded_per_speaker_disjoint_and_drops_short_speakers(tmp_path):
    spk2utt = spk2utt_of(6, 5)
    spk2utt["short"] = ["short-a", "short-b"]
    a = make_split(spk2utt, num_enrol=2, seed=3, folds=3)
    assert a == make_split(dict(reversed(list(spk2utt.items()))), num_enrol=2, seed=3, folds=3)
    assert a.dropped == ["short"] and "short" not in a.enrol
    for spk, utts in a.enrol.items():
        tests = [u for u, s in a.test if s == spk]
        assert len(utts) == 2 and len(tests) == 3
        assert sorted(utts + tests) == spk2utt[spk]  # disjoint, and every utterance used
    # a speaker's enrolment depends on (seed, speaker) only: other speakers do not move it
    fewer = make_split({k: spk2utt[k] for k in ("s01", "s04", "s05")}, num_enrol=2, seed=3, folds=3)
    assert all(fewer.enrol[s] == a.enrol[s] for s in fewer.enrol)
    other_seed = make_split(spk2utt, num_enrol=2, seed=4, folds=3)
    assert any(other_seed.enrol[s] != a.enrol[s] for s in a.enrol)
    # folds: every speaker in one fold, sizes within one of each other
    sizes = np.bincount(list(a.fold.values()))
    assert sizes.sum() == 6 and sizes.max() - sizes.min() <= 1
    write_split(a, tmp_path)
    assert read_split(tmp_path) == a


def test_read_split_names_file_and_line_of_an_utterance_in_both_lists(tmp_path):
    write_split(make_split(spk2utt_of(3, 3), 1, folds=2), tmp_path)
    enrol_line = (tmp_path / "enrol").read_text().splitlines()[0]
    with open(tmp_path / "test", "a") as f:
        f.write(enrol_line + "\n")
    n = len((tmp_path / "test").read_text().splitlines())
    with pytest.raises(InputError, match=rf"test:{n}: utterance .* already listed in enrol:1"):
        read_split(tmp_path)


def test_top_k_and_threshold_by_hand():
    scores = np.array([[0.9, 0.1, 0.2], [0.5, 0.4, 0.6], [0.3, 0.3, 0.1]])
    truth = np.array([0, 1, 1])
    assert top_k_accuracy(scores, truth, 1) == pytest.approx(1 / 3)  # the tie in row 3 counts against
    assert top_k_accuracy(scores, truth, 2) == pytest.approx(2 / 3)  # row 2: 0.4 is third
    assert top_k_accuracy(scores, truth, 3) == 1.0
    imp = np.arange(200, dtype=float)  # 1% of 200: two false alarms allowed
    thr, far = threshold_at_far(imp, 0.01)
    assert thr == 197.0 and far == 0.01
    thr, far = threshold_at_far(np.arange(50, dtype=float), 0.01)  # 0.5 allowed -> none
    assert thr == 49.0 and far == 0.0
    with pytest.raises(ValueError, match="no impostor trials"):
        threshold_at_far(np.array([]), 0.01)


def clustered(num_spk: int, num_utt: int, dim: int, nuisance: float, seed: int = 0) -> dict[str, np.ndarray]:
    """Speaker identity in the first half of the dimensions, a large per-utterance nuisance in
    the second half (channel-like): cosine suffers, LDA should project the nuisance out."""
    rng = np.random.default_rng(seed)
    emb = {}
    for s in range(num_spk):
        centre = rng.standard_normal(dim // 2)
        for u in range(num_utt):
            ident = centre + 0.3 * rng.standard_normal(dim // 2)
            emb[f"s{s:02d}-u{u:02d}"] = np.concatenate([ident, nuisance * rng.standard_normal(dim - dim // 2)])
    return emb


def test_lda_backend_projects_out_a_within_speaker_nuisance():
    emb = clustered(20, 6, 16, nuisance=4.0)
    split = make_split(spk2utt_of(20, 6), num_enrol=4, seed=0, folds=4)
    utts = [u for s in split.enrol for u in split.enrol[s]]
    labels = [s for s in split.enrol for _ in split.enrol[s]]
    top1 = {}
    for name, dim in (("cosine", 0), ("lda", 0), ("lda", 8)):
        backend = fit_backend(name, np.stack([emb[u] for u in utts]), labels, lda_dim=dim)
        spks, models = enrol(backend, emb, split.enrol)
        top1[name, dim] = closed_set(backend, spks, models, emb, split.test)[0]["top1"]
    # cosine is swamped by the nuisance; LDA's within-class whitening recovers most of it, and
    # keeping the 8 discriminant directions (the identity subspace) nearly all (1.0 without nuisance)
    assert top1["cosine", 0] <= 0.2 and top1["lda", 0] >= 0.75 and top1["lda", 8] >= 0.9, top1
    with pytest.raises(ValueError, match="a speaker with >= 2 utterances"):
        fit_backend("lda", np.stack([emb[u] for u in utts[::4]]), labels[::4])


def test_open_set_separable_speakers_are_all_identified_and_impostors_rejected():
    emb = clustered(15, 4, 16, nuisance=0.0)
    split = make_split(spk2utt_of(15, 4), num_enrol=2, seed=0, folds=5)
    m, trials = open_set("cosine", emb, split)
    assert m["folds"] == 5 and m["n_impostor_trials"] == len(split.test)  # each test utterance: one fold
    assert m["n_known_trials"] == 4 * len(split.test)
    assert m["achieved_far1"] <= 0.01 and m["dir_at_far1"] == 1.0 and m["open_top1"] == 1.0
    # an impostor's best speaker is never itself: it was not enrolled in that fold
    assert all(best != spk for _, _, spk, best, _, kind in trials if kind == "impostor")


def test_cli_names_the_scp_of_a_missing_embedding_and_the_missing_enrolment(tmp_path, caplog):
    from spkflow.bin.sid import main

    emb = clustered(4, 3, 8, nuisance=0.0)
    spk2utt = spk2utt_of(4, 3)
    (tmp_path / "spk2utt").write_text("".join(f"{s} {' '.join(u)}\n" for s, u in spk2utt.items()))
    scp = tmp_path / "xvector.scp"
    with kaldiio.WriteHelper(f"ark,scp:{tmp_path / 'xvector.ark'},{scp}") as w:
        for u, v in emb.items():
            if u != "s02-u01":
                w[u] = v.astype(np.float32)
    sid = tmp_path / "sid"
    assert (
        main(
            ["split", "--spk2utt", str(tmp_path / "spk2utt"), "--num-enrol", "2", "--folds", "2", "--outdir", str(sid)]
        )
        == 0
    )
    assert main(["closed", "--xvector-scp", str(scp), "--sid-dir", str(sid)]) == 1
    assert "spk_model.scp: not found: run the enrolment stage" in caplog.text
    split = read_split(sid)
    missing_is_enrol = "s02-u01" in split.enrol["s02"]
    rc = main(["enrol", "--xvector-scp", str(scp), "--sid-dir", str(sid)])
    if missing_is_enrol:
        assert rc == 1 and f"{scp}: 1 utterances have no embedding, e.g. ['s02-u01']" in caplog.text
    else:
        assert rc == 0 and main(["closed", "--xvector-scp", str(scp), "--sid-dir", str(sid)]) == 1
        assert f"{scp}: 1 utterances have no embedding, e.g. ['s02-u01']" in caplog.text
    assert not (sid / "metrics.json").exists() or "top1" not in (sid / "metrics.json").read_text()


# ----------------------------------------------------------------------------- recipe


def env() -> dict[str, str]:
    e = dict(os.environ, LC_ALL="C", OMP_NUM_THREADS="1")
    e.pop("PYTHONPATH", None)  # path.sh sets it to the project root
    return e


def sh(args: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(["bash", *map(str, args)], cwd=cwd, env=env(), capture_output=True, text=True, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}\nstdout:\n{p.stdout[-4000:]}\nstderr:\n{p.stderr[-4000:]}")
    return p


def run_py(args: list[str]) -> None:
    p = subprocess.run(args, env=dict(env(), PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-4000:]


def make_recipe(tmp_path: Path) -> Path:
    """A copy of the speechocean762 sid1 recipe dir (links to its files), outputs in tmp_path."""
    return linked_recipe(tmp_path, "sid1")


SO_TEST, DSP = ("speechocean762", "test", 6, 4), ("dspspeech20", "dsp20", 4, 6)
SO_TRAIN = ("speechocean762-train", "train", 6, 4)


def small_real_data(recipe: Path, corpus, sets=(SO_TEST, DSP)) -> None:
    """Data dirs of the first few speakers (LC_ALL=C order) x a few utterances of the real corpora
    (spkflow.bin.prepare_corpus, then utils/subset_data_dir.sh): by default data/test (6 x 4 of
    speechocean762 test) and data/dsp20 (4 x 6 of DSPSpeech-20)."""
    data = recipe / "data"
    prepare = [str(PY), "-m", "spkflow.bin.prepare_corpus"]
    for source, dst, num_spk, per_spk in sets:
        full = data / f"{dst}_all"
        if source.startswith("speechocean762"):
            split = "train" if source.endswith("train") else "test"
            run_py(
                [
                    *prepare,
                    "speechocean762",
                    "--utt2dur",
                    "false",
                    "--split",
                    split,
                    str(corpus("SPEECHOCEAN762")),
                    str(full),
                ]
            )
        else:
            run_py([*prepare, "dspspeech20", "--rounds", "01", str(corpus("DSPSPEECH20")), str(full)])
        spks = [ln.split()[0] for ln in (full / "spk2utt").read_text().splitlines()[:num_spk]]
        (data / f"{dst}.spk").write_text("".join(f"{s}\n" for s in spks))
        sh(["utils/subset_data_dir.sh", "--spk-list", data / f"{dst}.spk", full, data / f"{dst}_spk"], recipe)
        sh(["utils/subset_data_dir.sh", "--per-spk", data / f"{dst}_spk", per_spk, data / dst], recipe)


def cosine_top1(xvector_scp: Path, sid: Path) -> tuple[float, list[str]]:
    """Closed-set top-1 recomputed here: mean of the L2-normalised enrolment vectors, cosine."""
    xv = {k: v / np.linalg.norm(v) for k, v in kaldiio.load_scp(str(xvector_scp)).items()}
    enrol_lines = [ln.split() for ln in (sid / "enrol").read_text().splitlines()]
    spks = sorted({s for _, s in enrol_lines}, key=str.encode)
    models = np.stack([np.mean([xv[u] for u, s in enrol_lines if s == spk], axis=0) for spk in spks])
    models /= np.linalg.norm(models, axis=1, keepdims=True)
    test = [ln.split() for ln in (sid / "test").read_text().splitlines()]
    pred = [spks[int(np.argmax(models @ xv[u]))] for u, _ in test]
    return float(np.mean([p == s for p, (_, s) in zip(pred, test, strict=True)])), pred


@pytest.mark.slow
@pytest.mark.corpus
def test_sid_recipe_stages_5_to_8_on_real_audio(tmp_path, corpus, monkeypatch):
    from helpers.models import make_spkflow_model_dir

    recipe = make_recipe(tmp_path)
    small_real_data(recipe, corpus)
    monkeypatch.chdir(recipe)  # scp paths are relative to the recipe dir, as in Kaldi and ESPnet
    # 1) the model "trained here": exp/spk_<tag>, embeddings through spk.sh stage 5
    make_spkflow_model_dir(recipe / "exp" / "spk_tiny")
    p = sh(["run.sh", "--stage", "5", "--tag", "tiny", "--open_folds", "3"], recipe)
    assert "Stage 5: embedding extraction for test dsp20" in p.stdout  # spk.sh's own stage 5
    sid_root = recipe / "exp" / "spk_tiny" / "sid"
    for dset, num_spk, per_spk in (("test", 6, 4), ("dsp20", 4, 6)):
        sid = sid_root / dset
        m = json.loads((sid / "metrics.json").read_text())
        n_test = num_spk * (per_spk - 2)
        assert (m["set"], m["n_speakers"], m["n_test"], m["num_enrol"], m["backend"]) == (
            dset,
            num_spk,
            n_test,
            2,
            "cosine",
        )
        assert m["n_enrol_utts"] == 2 * num_spk and m["n_impostor_trials"] == n_test
        assert m["n_known_trials"] == 2 * n_test and m["folds"] == 3  # each test utterance is known in 2 of 3 folds
        assert 0.0 <= m["top1"] <= m["top5"] <= 1.0 and 0.0 <= m["dir_at_far1"] <= m["dir_at_far5"] <= 1.0
        assert m["achieved_far1"] <= 0.01
        if num_spk <= 5:
            assert m["top5"] == 1.0  # 5 guesses among <= 5 speakers
        # enrolment and test disjoint, together exactly the data dir
        enrol_utts = [ln.split()[0] for ln in (sid / "enrol").read_text().splitlines()]
        test_utts = [ln.split()[0] for ln in (sid / "test").read_text().splitlines()]
        data_utts = (recipe / "data" / dset / "utt2spk").read_text().split()[::2]
        assert not set(enrol_utts) & set(test_utts) and sorted(enrol_utts + test_utts) == sorted(data_utts)
        # the recipe's figures and predictions agree with a recomputation from xvector.scp
        xv_scp = recipe / "exp" / "spk_tiny" / "embed" / dset / "xvector.scp"
        top1, pred = cosine_top1(xv_scp, sid)
        assert m["top1"] == pytest.approx(top1)
        assert [ln.split()[2] for ln in (sid / "predictions").read_text().splitlines()] == pred
        assert (sid / "confusion.png").stat().st_size > 5000
        assert len(kaldiio.load_scp(str(sid / "spk_model.scp"))) == num_spk
    results = (sid_root / "RESULTS.md").read_text()
    assert "| test | 6 | 2 | 12 | cosine |" in results and "| dsp20 | 4 | 2 | 16 | cosine |" in results

    # 2) a reused model dir: stages 5-8 with --spk_model_dir, K=3 and the LDA backend
    other = make_spkflow_model_dir(tmp_path / "elsewhere" / "spk_reused")
    sh(["run.sh", "--stage", "5", "--spk_model_dir", other, "--num_enrol", "3", "--backend", "lda",
        "--open_folds", "3"], recipe)  # fmt: skip
    reused = recipe / "exp" / "spk_reused"
    assert (reused / "model_dir").read_text().strip() == str(other)
    a = kaldiio.load_scp(str(recipe / "exp" / "spk_tiny" / "embed" / "test" / "xvector.scp"))
    b = kaldiio.load_scp(str(reused / "embed" / "test" / "xvector.scp"))
    assert list(a) == list(b)
    same = max(float(np.abs(a[k] - b[k]).max()) for k in a)
    # the same weights through the same stage 5 (not in bench_float_spread.py's runs: needs the corpora)
    within("stage 5 of a reused model dir vs its own (same weights)", same, 1e-5)
    m = json.loads((reused / "sid" / "test" / "metrics.json").read_text())
    assert (m["num_enrol"], m["backend"], m["open_backend"], m["n_test"]) == (3, "lda", "lda", 6)

    # bad options are refused before any work
    p = sh(["run.sh", "--stage", "6", "--backend", "plda"], recipe, check=False)
    assert p.returncode == 2 and "--backend must be cosine, wccn or lda" in p.stdout
    p = sh(["run.sh", "--stage", "6", "--spk_model_dir", tmp_path / "nowhere"], recipe, check=False)
    assert p.returncode == 1 and "model not found" in p.stdout + p.stderr  # spkflow.bin.model_info names it


@pytest.mark.slow
@pytest.mark.corpus
def test_sid_recipe_trains_its_own_model_through_spk_sh(tmp_path, corpus, monkeypatch):
    """No --spk_model_dir: stages 2-4 are spk.sh's (fbank + VAD, batch lists, training) with a
    tiny config, then extraction and the SID stages on its model."""
    recipe = make_recipe(tmp_path)
    small_real_data(recipe, corpus, sets=(SO_TRAIN, SO_TEST))
    monkeypatch.chdir(recipe)
    config = {
        "frontend": {"vad": True, "mean_norm": False},
        "model": {"name": "ecapa_tdnn", "channels": 16, "scale": 4, "embed_dim": 8},
        "loss": {"name": "ge2e"},
        "optim": {"name": "adam", "lr": 0.01},
        "scheduler": {"name": "warmup_cosine", "warmup_steps": 1},
        "train": {"crop_min_frames": 50, "crop_max_frames": 80, "select": "last"},
    }
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(config))
    p = sh(["run.sh", "--stage", "2", "--test_sets", "test", "--train_config", tmp_path / "tiny.yaml",
            "--spk_opts", "--num_spk 3 --num_utt 2 --num_epochs 1", "--open_folds", "3"], recipe)  # fmt: skip
    out = p.stdout
    assert "Stages 2-4: features, batches, training (spk.sh) -> exp/spk_tiny" in out
    assert "Stage 4: training with" in out and "Stage 5: embedding extraction for test" in out
    assert Path("exp/spk_tiny/model.pth").is_file() and Path("dump/fbank/train/feats.scp").is_file()
    m = json.loads(Path("exp/spk_tiny/sid/test/metrics.json").read_text())
    assert (m["n_speakers"], m["n_test"], m["n_impostor_trials"]) == (6, 12, 12)
    assert m["top1"] == pytest.approx(
        cosine_top1(Path("exp/spk_tiny/embed/test/xvector.scp"), Path("exp/spk_tiny/sid/test"))[0]
    )


def test_sid_recipe_leaves_nothing_stale_and_names_the_speakers_it_drops(tmp_path):
    """sid.sh stages 6-8 on stage-5-style embeddings (a kaldi_ark written here; the model dir is
    only checked for its files): a speaker with one utterance is named on the console as left
    out; an enrolment list that an edit left without a speaker's enrolment utterances is refused
    by stage 7, and then no figure of the earlier run is left (predictions, closed.json,
    confusion.png, open.json, the closed and open figures of metrics.json, RESULTS.md)."""
    recipe = make_recipe(tmp_path)
    model = tmp_path / "models" / "spk_syn"
    model.mkdir(parents=True)
    (model / "config.yaml").write_text("model: {name: ecapa_tdnn}\n")
    (model / "model.pth").write_bytes(b"")
    emb = clustered(5, 4, 8, nuisance=0.0)
    emb["s09-u00"] = np.ones(8)  # a speaker with one utterance
    data = recipe / "data" / "test"
    data.mkdir(parents=True)
    spk2utt: dict[str, list[str]] = {}
    for u in emb:
        spk2utt.setdefault(u.split("-")[0], []).append(u)
    (data / "spk2utt").write_text("".join(f"{s} {' '.join(us)}\n" for s, us in sorted(spk2utt.items())))
    (data / "utt2spk").write_text("".join(f"{u} {u.split('-')[0]}\n" for u in sorted(emb)))
    xv = recipe / "exp" / "spk_syn" / "embed" / "test"
    xv.mkdir(parents=True)
    with kaldiio.WriteHelper(f"ark,scp:{xv / 'xvector.ark'},{xv / 'xvector.scp'}") as w:
        for u in sorted(emb):
            w[u] = emb[u].astype(np.float32)
    args = ["sid.sh", "--test_sets", "test", "--spk_model_dir", model, "--open_folds", "2"]
    p = sh([*args, "--stage", "6"], recipe)
    console = p.stdout + p.stderr
    assert "1 speaker(s) left out, with fewer than K + 1 = 3 utterances" in console
    assert "s09 (1)" in console and "dropped_spks" in console
    sid = recipe / "exp" / "spk_syn" / "sid" / "test"
    assert (sid / "dropped_spks").read_text() == "s09\n"
    m = json.loads((sid / "metrics.json").read_text())
    assert m["n_speakers"] == 5 and "top1" in m and "dir_at_far1" in m
    stale = ["predictions", "closed.json", "confusion.png", "open.json", "open_trials"]
    assert all((sid / f).exists() for f in stale) and (sid.parent / "RESULTS.md").exists()

    enrol = (sid / "enrol").read_text().splitlines()
    (sid / "enrol").write_text("".join(f"{ln}\n" for ln in enrol if not ln.endswith(" s01")))
    p = sh([*args, "--stage", "7"], recipe, check=False)
    assert p.returncode == 1
    assert "speaker 's01'" in p.stderr and "has no enrolment utterance" in p.stderr
    assert not [f for f in stale if (sid / f).exists()]
    assert not (sid.parent / "RESULTS.md").exists()
    m = json.loads((sid / "metrics.json").read_text())
    assert not {"top1", "n_test", "dir_at_far1", "n_known_trials", "open_top1", "open_backend"} & set(m)
    assert m["num_enrol"] == 2  # the split's own figures stay: its files are still there
