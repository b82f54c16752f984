"""The espnet toolkit path: ESPnet speaker models built and saved here with
``espnet2.tasks.spk.SpeakerTask`` (tiny ECAPA-TDNN, x-vector, RawNet3, ResNet and MFA-Conformer
configs, random weights, no downloads), run batched by :class:`spkflow.embed.espnet.EspnetEmbedder`
and by the extraction script; compared with ESPnet's own single-utterance inference (``model(speech,
extract_embd=True)`` and ``Speech2Embedding``) on synthetic and real speech; outputs read back
through ESPnet's own ``ESPnetDataset`` (``kaldi_ark``).

What ESPnet itself does with a padded batch is checked too: ``MelSpectrogramTorch`` reports the
padded length for every row and the encoders take no lengths, so ESPnet's batched forward
changes the embeddings of the shorter utterances; ours does not."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from helpers.audio import make_mixed_data
from helpers.models import ESPNET_CONFIGS, l2, save_espnet_model
from helpers.paths import ROOT
from helpers.recipes import SCRIPT, env, extract
from helpers.spread import permuted, within

torch = pytest.importorskip("torch")
SpeakerTask = pytest.importorskip("espnet2.tasks.spk").SpeakerTask

CONFIGS = ESPNET_CONFIGS
MASKED = ["ecapa", "xvector", "rawnet3", "resnet", "conformer"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("espnet_models")
    return {name: save_espnet_model(root / name, cfg) for name, cfg in CONFIGS.items()}


def waves(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    t = [16000, 5200, 23456, 8000, 3300]  # 0.2 to 1.5 s: up to 7x padding
    return [
        (0.1 * rng.standard_normal(n) + 0.3 * np.sin(np.arange(n) * 0.05 * (i + 1))).astype(np.float32)
        for i, n in enumerate(t)
    ]


def espnet_alone(model, xs: list[np.ndarray]) -> np.ndarray:
    """ESPnet's own single-utterance inference (what Speech2Embedding.__call__ does)."""
    with torch.no_grad():
        return np.concatenate([model(speech=torch.from_numpy(x)[None], extract_embd=True).numpy() for x in xs])


@pytest.mark.parametrize("name", ["ecapa", "rawnet3", "resnet", "conformer"])
def test_espnet_batched_forward_is_not_padding_invariant(models, name):
    """Documents ESPnet: lengths stop at the frontend (MelSpectrogramTorch and the asteroid frontend
    drop them), so its own padded batch moves every embedding but the longest one's."""
    from spkflow.embed.espnet import EspnetEmbedder

    model = EspnetEmbedder(models[name]).model
    xs = waves()
    lens = torch.tensor([len(x) for x in xs])
    padded = torch.nn.utils.rnn.pad_sequence([torch.from_numpy(x) for x in xs], batch_first=True)
    with torch.no_grad():
        if name == "ecapa":
            _, flens = model.frontend(padded, lens)
            assert flens.tolist() == [float(padded.shape[1] // 160 + 1)] * len(xs)  # the padded length for all
        batched = model(speech=padded, speech_lengths=lens, extract_embd=True).numpy()
    alone = espnet_alone(model, xs)
    diff = np.abs(l2(batched) - l2(alone)).max(axis=1)
    longest = int(np.argmax([len(x) for x in xs]))
    # measured <= 4e-7 (1 and 2 threads)
    within("ESPnet's own padded batch vs alone, longest utterance (L2-normalised)", float(diff[longest]), 1e-4)
    assert np.delete(diff, longest).min() > 1e-3, diff


@pytest.mark.parametrize("name", list(CONFIGS))
def test_batched_equals_espnet_alone(models, name, monkeypatch):
    """Every encoder but the legacy-attention conformer runs as one padded batch under the mask
    (the equal-length fallback is made to fail for them), and equals ESPnet alone."""
    from spkflow.embed.espnet import EspnetEmbedder

    emb = EspnetEmbedder(models[name])
    assert (emb.mask is not None) == (name in MASKED)
    if name in MASKED:
        monkeypatch.setattr(emb, "_equal_lengths", lambda *a: pytest.fail("not batched"))
    xs = permuted(waves(1))
    batched = emb.embed(xs)
    assert batched.shape == (len(xs), 16)
    alone = espnet_alone(emb.model, xs)
    # measured <= 8.6e-7 (1 and 2 threads)
    within("batched vs ESPnet alone (L2-normalised)", float(np.abs(l2(batched) - l2(alone)).max()), 1e-4)
    # and ESPnet's own inference class gives the same numbers
    if name in ("ecapa", "rawnet3"):
        from espnet2.bin.spk_inference import Speech2Embedding

        s2e = Speech2Embedding(models[name] / "config.yaml", models[name] / "model.pth")
        ref = np.concatenate([s2e(x).numpy() for x in xs])
        # measured <= 8.6e-7 (1 and 2 threads)
        within("batched vs Speech2Embedding (L2-normalised)", float(np.abs(l2(batched) - l2(ref)).max()), 1e-4)


def test_legacy_relative_attention_is_not_padding_invariant(models, monkeypatch):
    """Why the legacy conformer is not masked: its rel_shift reads positions that move when the
    time axis grows, so even a masked padded batch changes the shorter utterances (1e-3 here);
    it runs in equal-length groups instead, each equal to ESPnet alone."""
    from spkflow.embed import espnet
    from spkflow.embed.masking import Block

    nets = "espnet.nets.pytorch_backend.transformer"
    forced = dict(espnet.BLOCKS)
    forced[f"{nets}.attention.LegacyRelPositionMultiHeadedAttention"] = Block(frame_wise=True)
    forced[f"{nets}.embedding.LegacyRelPositionalEncoding"] = Block(frame_wise=True)
    monkeypatch.setattr(espnet, "BLOCKS", forced)
    emb = espnet.EspnetEmbedder(models["conformer_legacy"])
    assert emb.mask is not None
    xs = waves(1)
    diff = np.abs(l2(emb.embed(xs)) - l2(espnet_alone(emb.model, xs))).max(axis=1)
    assert diff.max() > 1e-4, diff
    monkeypatch.undo()
    emb = espnet.EspnetEmbedder(models["conformer_legacy"])
    assert emb.mask is None
    calls = []
    encode = emb.model.encode_frame
    monkeypatch.setattr(emb.model, "encode_frame", lambda f: calls.append(f.shape[0]) or encode(f))
    twins = [xs[0], xs[1], xs[0].copy(), xs[2]]  # two utterances of equal length run as one batch
    out = emb.embed(twins)
    assert sorted(calls) == [1, 1, 2]
    worst = float(np.abs(l2(out) - l2(espnet_alone(emb.model, twins))).max())
    # measured <= 5.4e-7 (1 and 2 threads)
    within("equal-length groups vs ESPnet alone (L2-normalised)", worst, 1e-4)


def test_weights_must_fit_the_config(models, tmp_path):
    from spkflow.core.errors import InputError
    from spkflow.embed.espnet import EspnetEmbedder

    d = tmp_path / "wrong"
    d.mkdir()
    cfg = dict(CONFIGS["ecapa"], encoder_conf=dict(model_scale=4, ndim=16, output_size=48))
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    (d / "model.pth").write_bytes((models["ecapa"] / "model.pth").read_bytes())
    with pytest.raises(InputError, match=r"model.pth: weights do not fit .*config.yaml"):
        EspnetEmbedder(d)
    (d / "model.pth").rename(d / "a.pth")
    (d / "b.pth").write_bytes(b"")
    with pytest.raises(InputError, match=r"several: a.pth b.pth\); give --model-file"):
        EspnetEmbedder(d)


def test_script_espnet_nj2_loads_in_espnet_dataset(models, tmp_path):
    from espnet2.train.dataset import ESPnetDataset

    from spkflow.data.audio import AudioReader
    from spkflow.embed.espnet import EspnetEmbedder

    data = make_mixed_data(tmp_path, num_spk=2, num_utt=3)  # 8 / 16 / 22.05 kHz -> 16 kHz
    out = tmp_path / "out"
    utts, _ = extract("espnet", models["ecapa"], data, out, "--batch-size", "3", "--num-workers", "0")
    spks = [ln.split()[0] for ln in (data / "spk2utt").read_text().splitlines()]
    ds = ESPnetDataset([(str(out / "xvector.scp"), "spembs", "kaldi_ark")])
    assert list(ds.loader_dict["spembs"].keys()) == utts
    model = EspnetEmbedder(models["ecapa"]).model
    reader = AudioReader(data, sample_rate=16000)
    ref = espnet_alone(model, [reader.read(u) for u in utts])
    worst = 0.0
    for i, u in enumerate(utts):
        uid, item = ds[u]
        assert uid == u and item["spembs"].dtype == np.float32 and item["spembs"].shape == (16,)
        worst = max(worst, float(np.abs(l2(item["spembs"]) - l2(ref[i])).max()))
    # measured <= 1.3e-7 (1 and 2 threads)
    within("stage 5 (ESPnetDataset) vs ESPnet alone (L2-normalised)", worst, 1e-4)
    spk_ds = ESPnetDataset([(str(out / "spk_xvector.scp"), "spembs", "kaldi_ark")])
    assert list(spk_ds.loader_dict["spembs"].keys()) == spks
    for spk in spks:
        members = [i for i, u in enumerate(utts) if u.startswith(spk + "-")]
        got = spk_ds[spk][1]["spembs"]
        want = np.mean([ds[utts[i]][1]["spembs"] for i in members], axis=0)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.corpus
@pytest.mark.parametrize("name", ["rawnet3", "resnet"])
def test_script_nj2_real_speech_equals_speech2embedding(models, name, tmp_path, corpus):
    """Done-when of the batched encoders: extract_embeddings.sh --toolkit espnet --nj 2 on real
    speech (LibriSpeech 6-20 s and FSDD 8 kHz digits, so batches pad up to 20x) equals ESPnet's
    own Speech2Embedding on each utterance alone (read at 16 kHz by the same reader) within 1e-4."""
    import kaldiio
    from espnet2.bin.spk_inference import Speech2Embedding

    from helpers.corpora import real_speech_data_dir
    from spkflow.data.audio import AudioReader

    data = real_speech_data_dir(corpus, tmp_path / "data")
    out = tmp_path / "out"
    cmd = ["bash", str(SCRIPT), "--toolkit", "espnet", "--nj", "2", "--batch-size", "4", "--max-frames", "100000"]
    p = subprocess.run(
        [*cmd, "--model-dir", str(models[name]), str(data), str(out)],
        env=env(),
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    assert "one at a time" not in p.stderr and "equal length" not in p.stderr  # batched
    utts = (data / "utt2spk").read_text().split()[::2]
    xv = kaldiio.load_scp(str(out / "xvector.scp"))
    assert list(xv) == utts
    s2e = Speech2Embedding(models[name] / "config.yaml", models[name] / "model.pth")
    reader = AudioReader(data, sample_rate=16000)
    diff = max(float(np.abs(l2(xv[u]) - l2(s2e(reader.read(u)).numpy()[0])).max()) for u in utts)
    # measured <= 1.2e-7 (2 threads)
    within("stage 5 --nj 2 vs Speech2Embedding (L2-normalised)", diff, 1e-4)


def test_bfloat16_is_close_and_stamped(models):
    from spkflow.embed.espnet import EspnetEmbedder

    f32 = EspnetEmbedder(models["rawnet3"])
    b16 = EspnetEmbedder(models["rawnet3"], dtype="bfloat16")
    assert b16.stamp == f32.stamp + " dtype=bfloat16"
    xs = waves(2)
    got = b16.embed(xs)
    assert got.dtype == np.float32
    assert (l2(f32.embed(xs)) * l2(got)).sum(axis=1).min() > 0.99


def test_default_max_frames_scales_with_the_encoders_frame_rate(models):
    """RawNet3's sinc frontend reads 1 ms frames (10 per 10 ms): its default bound on padded 10 ms
    frames is a tenth of a mel model's, 300 on CPU and 6000 on CUDA."""
    from spkflow.embed.base import CPU_MAX_FRAMES, GPU_MAX_FRAMES, default_max_frames
    from spkflow.embed.espnet import EspnetEmbedder

    rawnet3, ecapa = EspnetEmbedder(models["rawnet3"]), EspnetEmbedder(models["ecapa"])
    assert (rawnet3.frames_per_10ms, ecapa.frames_per_10ms) == (10.0, 1.0)
    assert default_max_frames(rawnet3, "cpu") == CPU_MAX_FRAMES // 10 == 300
    assert default_max_frames(rawnet3, "cuda:0") == GPU_MAX_FRAMES // 10
    assert default_max_frames(ecapa, "cpu") == CPU_MAX_FRAMES
    assert default_max_frames(object(), "cuda") == GPU_MAX_FRAMES  # spkflow / ONNX models: 10 ms frames
