"""The speechbrain toolkit path: SpeechBrain pretrained folders written by SpeechBrain's own code
(``helpers.models.make_speechbrain_dir``: its hub layout, ECAPA-TDNN and x-vector encoders with
random weights, checkpoint hooks, label encoder), loaded by :class:`spkflow.embed.speechbrain.
SpeechbrainEmbedder` through ``EncoderClassifier.from_hparams`` with no network, run batched and
compared with SpeechBrain's own ``encode_batch`` of each utterance alone, on real speech."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from helpers.audio import make_speakers
from helpers.models import l2, make_speechbrain_dir
from helpers.paths import ROOT
from helpers.recipes import SCRIPT, env, extract
from helpers.spread import within

torch = pytest.importorskip("torch")
pytest.importorskip("speechbrain")

from spkflow.core.errors import InputError  # noqa: E402
from spkflow.embed.speechbrain import SpeechbrainEmbedder  # noqa: E402


@pytest.fixture(scope="module")
def sb_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("speechbrain")
    return {kind: make_speechbrain_dir(root / kind, kind) for kind in ("ecapa", "xvector")}


@pytest.fixture
def libri(corpus) -> list[np.ndarray]:
    """Six LibriSpeech utterances cut to 2.5-6 s (16 kHz), so a batch pads up to 2.4x."""
    import soundfile as sf

    files = sorted(corpus("LIBRISPEECH").rglob("*.flac"))[::8][:6]
    return [sf.read(f, dtype="float32")[0][: 40000 + 10000 * i] for i, f in enumerate(files)]


def alone(emb: SpeechbrainEmbedder, xs: list[np.ndarray]) -> np.ndarray:
    """SpeechBrain's own inference: ``encode_batch`` of each utterance alone (ESPnet's call)."""
    with torch.no_grad():
        return np.concatenate([emb.classifier.encode_batch(torch.from_numpy(x)).reshape(1, -1).numpy() for x in xs])


@pytest.mark.corpus
@pytest.mark.parametrize("kind", ["ecapa", "xvector"])
def test_batched_equals_encode_batch_alone_on_real_speech(sb_dirs, kind, libri, monkeypatch):
    """One padded batch (the equal-length fallback made to fail) equals encode_batch alone within
    1e-5.  SpeechBrain's x-vector pooling adds random noise to its mean on every call (up to 9e-5:
    two calls on the same utterance differ by ~3e-5); it is zeroed here, in both paths, so that
    what is compared is the batching's float rounding, not that noise."""
    from speechbrain.nnet.pooling import StatisticsPooling

    monkeypatch.setattr(StatisticsPooling, "_get_gauss_noise", lambda self, shape, device="cpu": torch.zeros(shape))
    emb = SpeechbrainEmbedder(sb_dirs[kind])
    assert emb.mask is not None and emb.dim == 16 and emb.sample_rate == 16000
    monkeypatch.setattr("spkflow.embed.speechbrain.equal_length_groups", lambda n: pytest.fail("not batched"))
    got = emb.embed(libri)
    diff = float(np.abs(l2(got) - l2(alone(emb, libri))).max())
    within("batched vs encode_batch alone (L2-normalised)", diff, 1e-5)  # measured <= 2.1e-7 (1 and 2 threads)


@pytest.mark.corpus
def test_closer_than_speechbrains_own_batch(sb_dirs, libri):
    """SpeechBrain's encode_batch(wavs, wav_lens) moves the shorter utterances (one frame more or
    less in its sentence normalisation, the batch's zeros instead of each utterance's reflection);
    ours stays at float rounding.  Without our reflection hook the masked batch is no better than
    SpeechBrain's: the hook is what makes the difference."""
    emb = SpeechbrainEmbedder(sb_dirs["ecapa"])
    ref = l2(alone(emb, libri))
    lens = torch.tensor([len(x) for x in libri])
    padded = torch.nn.utils.rnn.pad_sequence([torch.from_numpy(x) for x in libri], batch_first=True)
    with torch.no_grad():
        theirs = emb.classifier.encode_batch(padded, lens / lens.max()).reshape(len(libri), -1).numpy()
    d_theirs = np.abs(l2(theirs) - ref).max(axis=1)
    d_ours = np.abs(l2(emb.embed(libri)) - ref).max(axis=1)
    longest = int(np.argmax(lens))
    within("SpeechBrain's own padded batch vs alone, longest (L2-normalised)", float(d_theirs[longest]), 1e-5)
    assert np.delete(d_theirs, longest).max() > 1e-5, d_theirs
    assert d_ours.max() < np.delete(d_theirs, longest).max() / 10, (d_ours, d_theirs)
    for mod in emb.model.modules():  # the same masked batch without the per-utterance reflection
        if type(mod).__name__ == "Conv1d" and hasattr(mod, "conv"):
            mod.conv._forward_pre_hooks.clear()
    d_unhooked = np.abs(l2(emb.embed(libri)) - ref).max(axis=1)
    assert np.delete(d_unhooked, longest).max() > 1e-5, d_unhooked


def test_loads_with_no_network_and_writes_nothing(sb_dirs, tmp_path, monkeypatch):
    """The folder's hyperparams name the hub repo (as published); loading must not reach it, nor
    write symlinks or a pretrained_models/ dir anywhere."""
    import huggingface_hub
    import speechbrain.utils.fetching as fetching

    def no_network(*args, **kwargs):
        raise AssertionError(f"network access: {args} {kwargs}")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_network)
    monkeypatch.setattr(fetching, "download_file", no_network)
    monkeypatch.chdir(tmp_path)
    d = sb_dirs["ecapa"]
    before = {p.name: p.stat().st_mtime_ns for p in d.iterdir()}
    emb = SpeechbrainEmbedder(d)
    assert "pretrained_path: speechbrain/spkrec-ecapa-voxceleb" in (d / "hyperparams.yaml").read_text()
    assert {p.name: p.stat().st_mtime_ns for p in d.iterdir()} == before
    assert list(tmp_path.iterdir()) == []
    files = ["classifier.ckpt", "embedding_model.ckpt", "mean_var_norm_emb.ckpt"]
    assert emb.stamp.startswith("toolkit=speechbrain ") and len(emb.stamp.split()) == 1 + 1 + len(files)


def test_bad_folders_are_named(sb_dirs, tmp_path, monkeypatch):
    src = sb_dirs["ecapa"]

    def copy(name: str) -> Path:
        d = tmp_path / name
        d.mkdir()
        for p in src.iterdir():
            (d / p.name).write_bytes(p.read_bytes())
        return d

    with pytest.raises(InputError, match=r"hyperparams.yaml: not found"):
        SpeechbrainEmbedder(tmp_path)
    cut = copy("cut")
    raw = (cut / "embedding_model.ckpt").read_bytes()
    (cut / "embedding_model.ckpt").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(InputError, match=r"cut/embedding_model.ckpt: unreadable or truncated"):
        SpeechbrainEmbedder(cut)
    partial = copy("partial")  # weights with a layer missing: SpeechBrain's transfer only logs it
    state = torch.load(partial / "embedding_model.ckpt", weights_only=True)
    del state["fc.conv.weight"]
    torch.save(state, partial / "embedding_model.ckpt")
    with pytest.raises(InputError, match=r"partial/embedding_model.ckpt: weights do not fit .*missing fc.conv.weight"):
        SpeechbrainEmbedder(partial)
    misfit = copy("misfit")  # another architecture's hyperparams: SpeechBrain's own error, with the file
    text = (misfit / "hyperparams.yaml").read_text().replace("attention_channels: 16", "attention_channels: 8")
    (misfit / "hyperparams.yaml").write_text(text)
    with pytest.raises(InputError, match=r"misfit/hyperparams.yaml: SpeechBrain cannot load it: .*size mismatch"):
        SpeechbrainEmbedder(misfit)
    monkeypatch.setitem(__import__("sys").modules, "speechbrain", None)
    with pytest.raises(InputError, match=r"pip install '[^']*\[speechbrain\]'"):
        SpeechbrainEmbedder(src)


def test_bfloat16_is_close_and_stamped(sb_dirs):
    xs = [np.sin(np.arange(n) * 0.03).astype(np.float32) * 0.3 for n in (16000, 9000, 23000)]
    f32 = SpeechbrainEmbedder(sb_dirs["ecapa"])
    b16 = SpeechbrainEmbedder(sb_dirs["ecapa"], dtype="bfloat16")
    assert b16.stamp == f32.stamp + " dtype=bfloat16"
    cos = (l2(f32.embed(xs)) * l2(b16.embed(xs))).sum(axis=1)
    assert cos.min() > 0.99 and b16.embed(xs).dtype == np.float32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_cuda_equals_cpu(sb_dirs):
    xs = [np.sin(np.arange(n) * 0.03).astype(np.float32) * 0.3 for n in (16000, 9000, 23000)]
    cpu, gpu = SpeechbrainEmbedder(sb_dirs["ecapa"]), SpeechbrainEmbedder(sb_dirs["ecapa"], device="cuda")
    assert np.abs(l2(cpu.embed(xs)) - l2(gpu.embed(xs))).max() <= 1e-4


@pytest.mark.corpus
def test_script_nj2_real_speech_equals_encode_batch(sb_dirs, tmp_path, corpus):
    """Done-when: extract_embeddings.sh --toolkit speechbrain --nj 2 on real speech (LibriSpeech
    6-20 s, FSDD 8 kHz resampled by the reader), one vector per utterance in data-dir order,
    equal to encode_batch of each utterance alone within 1e-3 (we get 1e-5)."""
    from helpers.corpora import real_speech_data_dir
    from spkflow.data.audio import AudioReader

    data = real_speech_data_dir(corpus, tmp_path / "data")
    out = tmp_path / "out"
    d = sb_dirs["ecapa"]
    utts, xv = extract("speechbrain", d, data, out, "--batch-size", "4", "--max-frames", "100000")
    emb = SpeechbrainEmbedder(d)
    reader = AudioReader(data, sample_rate=16000)
    ref = alone(emb, [reader.read(u) for u in utts])
    diff = max(float(np.abs(l2(xv[u]) - l2(ref[i])).max()) for i, u in enumerate(utts))
    within("stage 5 vs encode_batch alone (L2-normalised)", diff, 1e-5)  # measured 8.9e-8 (2 threads)
    assert (out / "jobs" / "model.stamp").read_text().strip() == emb.stamp


def test_script_skip_bad_names_a_too_short_utterance(sb_dirs, tmp_path):
    """An utterance shorter than the model's shortest input (SpeechBrain's reflect padding needs
    more frames than it pads) fails by name in the worker, or is listed with --skip-bad true."""
    import soundfile as sf

    data = make_speakers(tmp_path, num_spk=2, num_utt=2, seed=3)
    short = tmp_path / "audio" / "short.wav"
    sf.write(short, np.zeros(400, dtype=np.float32), 16000)  # 25 ms
    wav = (data / "wav.scp").read_text().splitlines()
    wav[0] = f"{wav[0].split()[0]} {short}"
    (data / "wav.scp").write_text("\n".join(wav) + "\n")
    victim = wav[0].split()[0]
    base = ["bash", str(SCRIPT), "--toolkit", "speechbrain", "--nj", "2", "--model-dir", str(sb_dirs["ecapa"])]
    p = subprocess.run(
        [*base, "--nj", "1", str(data), str(tmp_path / "o1")], env=env(), capture_output=True, text=True, cwd=ROOT
    )
    assert p.returncode == 1
    logs = "".join(f.read_text() for f in (tmp_path / "o1" / "log").glob("extract_*.log"))
    assert f"{victim}" in logs and "shorter than the model's shortest input" in logs
    out = tmp_path / "o2"
    p = subprocess.run(
        [*base, "--skip-bad", "true", str(data), str(out)], env=env(), capture_output=True, text=True, cwd=ROOT
    )
    assert p.returncode == 0, p.stderr
    assert (out / "bad_utts").read_text().startswith(f"{victim} ")
    assert os.path.getsize(out / "xvector.scp") > 0 and victim not in (out / "xvector.scp").read_text()
