"""ESPnet TTS on spkflow x-vectors (egs/speechocean762/tts1), for real: our extraction writes
tts.sh's layout, ESPnet's own tts_train trains a tiny Tacotron 2 on the per-utterance x-vectors
(collect_stats, then training) and tts_inference synthesises with the per-speaker x-vectors,
on a handful of real speechocean762 utterances. The spkflow model has random weights (a real
model and real arks; training one would add minutes and change nothing ESPnet sees)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import kaldiio
import numpy as np
import pytest
import yaml

from helpers.recipes import linked_recipe


def sh(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, LC_ALL="C", OMP_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)  # path.sh sets it to the project root
    p = subprocess.run(["bash", *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise AssertionError(f"exit {p.returncode}\nstdout:\n{p.stdout[-4000:]}\nstderr:\n{p.stderr[-4000:]}")
    return p


@pytest.mark.slow
@pytest.mark.corpus
def test_espnet_tts_trains_and_synthesises_on_our_xvectors(tmp_path, corpus, monkeypatch):
    from helpers.models import make_spkflow_model_dir

    corpus("SPEECHOCEAN762")
    recipe = linked_recipe(tmp_path, "tts1")
    model = make_spkflow_model_dir(tmp_path / "spk_model")  # 16-d embeddings
    opts = ["--spk_model_dir", model, "--local_data_opts", "--num-spk 3 --train-utts 2 --eval-spk 2"]
    opts += ["--train_args", "--max_epoch 1 --batch_size 2"]
    sh(["run.sh", "--stop_stage", "1", *opts], recipe)
    monkeypatch.chdir(recipe)  # scp paths are relative to the recipe dir
    # three utterances say the same sentence: two of the first unseen speaker, one of the second
    ev = Path("data/ev")
    utt2spk = dict(ln.split() for ln in (ev / "utt2spk").read_text().splitlines())
    spks = sorted(set(utt2spk.values()))
    a1, a2 = [u for u in utt2spk if utt2spk[u] == spks[0]][:2]
    b1 = next(u for u in utt2spk if utt2spk[u] == spks[1])
    text = dict(ln.split(" ", 1) for ln in (ev / "text").read_text().splitlines())
    for u in (a1, a2, b1):
        text[u] = "MARK IS GOING TO SEE ELEPHANT"
    (ev / "text").write_text("".join(f"{u} {text[u]}\n" for u in sorted(text, key=str.encode)))

    p = sh(["run.sh", "--stage", "2", *opts], recipe)
    assert "1epoch results" in p.stdout and "8 waveforms in exp/tts_tiny_tacotron2/decode_ev/wav" in p.stdout

    # 1. tts.sh's layout and names: dump/xvector/<set>/{xvector,spk_xvector}.scp, read by ESPnet's dataset
    from espnet2.train.dataset import ESPnetDataset

    for dset in ("tr", "dv", "ev"):
        utts = (Path("data") / dset / "utt2spk").read_text().split()[::2]
        scp = Path("dump/xvector") / dset / "xvector.scp"
        ds = ESPnetDataset([(str(scp), "spembs", "kaldi_ark")])
        assert list(ds.loader_dict["spembs"].keys()) == utts
        assert ds[utts[0]][1]["spembs"].shape == (16,)
        spk = kaldiio.load_scp(str(Path("dump/xvector") / dset / "spk_xvector.scp"))
        assert sorted(spk) == sorted(
            set(ln.split()[1] for ln in (Path("data") / dset / "utt2spk").read_text().splitlines())
        )

    # 2. ESPnet trained with our per-utterance x-vectors as spembs, of their dimension
    cfg = yaml.safe_load(Path("exp/tts_tiny_tacotron2/config.yaml").read_text())
    assert cfg["tts_conf"]["spk_embed_dim"] == 16
    assert ["dump/xvector/tr/xvector.scp", "spembs", "kaldi_ark"] in cfg["train_data_path_and_name_and_type"]
    assert cfg["normalize"] == "global_mvn" and cfg["normalize_conf"]["stats_file"].endswith("train/feats_stats.npz")
    assert set(Path("exp/tts_stats_tiny_tacotron2/train/spembs_shape").read_text().split()[1::2]) == {"16"}
    assert Path("exp/tts_tiny_tacotron2/1epoch.pth").is_file()

    # 3. inference with per-speaker x-vectors: each utterance points at its speaker's mean vector
    by_utt = kaldiio.load_scp("dump/xvector/ev/spk_xvector_by_utt.scp")
    spk_x = kaldiio.load_scp("dump/xvector/ev/spk_xvector.scp")
    assert sorted(by_utt) == sorted(utt2spk) and all(np.array_equal(by_utt[u], spk_x[utt2spk[u]]) for u in utt2spk)
    lines = Path("exp/tts_tiny_tacotron2/decode_ev/norm/feats.scp").read_text().splitlines()
    feats = {u: np.load(path) for u, path in (ln.split() for ln in lines)}  # ESPnet's npy scp
    assert sorted(feats) == sorted(utt2spk)
    assert all(Path(f"exp/tts_tiny_tacotron2/decode_ev/wav/{u}.wav").stat().st_size > 1000 for u in utt2spk)
    # same sentence + same speaker vector -> same output (fixed seed); another speaker's vector -> another
    np.testing.assert_array_equal(feats[a1], feats[a2])
    n = min(len(feats[a1]), len(feats[b1]))
    assert len(feats[a1]) != len(feats[b1]) or not np.allclose(feats[a1][:n], feats[b1][:n], atol=1e-4)
