"""The resemblyzer toolkit path: Resemblyzer's pretrained GE2E encoder (``pretrained.pt``, shipped in
its PyPI wheel) run by :class:`spkflow.embed.resemblyzer.ResemblyzerEmbedder`, the API and the
extraction script, compared with Resemblyzer's own ``VoiceEncoder.embed_utterance(preprocess_wav(wav))``
of each utterance alone, on synthetic audio (always) and real speech (the corpora)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from helpers.audio import make_speakers, synth_voice, write_data_dir_by_prefix
from helpers.recipes import SCRIPT, env, extract
from helpers.spread import within

torch = pytest.importorskip("torch")
resemblyzer = pytest.importorskip("resemblyzer")

from resemblyzer import VoiceEncoder, preprocess_wav  # noqa: E402
from resemblyzer.audio import normalize_volume  # noqa: E402
from resemblyzer.hparams import audio_norm_target_dBFS  # noqa: E402

import spkflow.embed.resemblyzer as rz_module  # noqa: E402
from spkflow import Embedder  # noqa: E402
from spkflow.core.errors import InputError  # noqa: E402
from spkflow.embed import detect_toolkit  # noqa: E402
from spkflow.embed.base import ModelError, model_files  # noqa: E402
from spkflow.embed.open import check_options  # noqa: E402
from spkflow.embed.resemblyzer import ResemblyzerEmbedder  # noqa: E402

#: the installed package's folder: what a user gives as the model (it holds pretrained.pt)
PKG = Path(resemblyzer.__file__).resolve().parent


@pytest.fixture(scope="module")
def encoder() -> VoiceEncoder:
    return VoiceEncoder("cpu", verbose=False)


@pytest.fixture(scope="module")
def emb() -> ResemblyzerEmbedder:
    return ResemblyzerEmbedder(PKG)


def resemblyzer_alone(encoder: VoiceEncoder, wave: np.ndarray, trim: bool = True) -> np.ndarray:
    """Resemblyzer's own embedding of one utterance at 16 kHz: ``embed_utterance(preprocess_wav(wav))``,
    or without its silence trimming (the volume normalisation only)."""
    wav = preprocess_wav(wave) if trim else normalize_volume(wave, audio_norm_target_dBFS, increase_only=True)
    return encoder.embed_utterance(wav)


def synthetic() -> list[np.ndarray]:
    """Voices of 0.4 s (less than a partial) to 6 s, two of them with long pauses inside (so that
    webrtcvad's trimming cuts them), at 16 kHz."""
    rng = np.random.default_rng(3)
    # the first three end in sound, as windows cut out of speech do (a click; a cut; the voice's end),
    # so that the last partial's padding reads their last samples
    voices = [
        synth_voice(rng, 90 + 30 * i, (500.0 + 200 * i, 1500.0, 2500.0), s) for i, s in enumerate((0.4, 2.0, 3.1))
    ]
    click = (0.3 * rng.standard_normal(480)).astype(np.float32)
    waves = [np.concatenate([voices[0][:-4000], click]), voices[1][3200:23200], voices[2][:-4000]]
    pause = (0.002 * rng.standard_normal(16000)).astype(np.float32)
    for f0 in (110.0, 180.0):
        parts = [synth_voice(rng, f0, (700.0, 1200.0, 2600.0), s) for s in (1.2, 2.0, 1.5)]
        waves.append(np.concatenate([parts[0], pause, parts[1], pause[:9000], parts[2]]))
    return waves


def test_equals_embed_utterance_on_synthetic_audio(emb, encoder):
    """Batched (every partial of five utterances in one forward) = Resemblyzer's embed_utterance of
    each alone, with and without the trimming; the partials are Resemblyzer's own."""
    waves = synthetic()
    assert all(len(preprocess_wav(w)) < len(w) - 8000 for w in waves[3:])  # the pauses are trimmed
    for trim in (True, False):
        e = ResemblyzerEmbedder(PKG, trim_silences=trim) if not trim else emb
        xs = [e.prepare_wave(w) for w in waves]
        for w, x in zip(waves, xs, strict=True):
            wav = preprocess_wav(w) if trim else normalize_volume(w, audio_norm_target_dBFS, increase_only=True)
            _, partials, _ = encoder.embed_utterance(wav, return_partials=True)
            assert x.shape == (len(partials) * 160, 40)
        got = e.embed(xs)
        ref = np.stack([resemblyzer_alone(encoder, w, trim) for w in waves])
        # measured 2.1e-7 (trimmed), 1.6e-7 (whole; 1 thread)
        within(f"batched vs embed_utterance alone (trim {trim})", float(np.abs(got - ref).max()), 1e-5)
        assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-6)
    trimmed, whole = emb.embed(emb.prepare_wave(waves[3])[None]), ResemblyzerEmbedder(PKG, trim_silences=False)
    assert float(np.abs(trimmed - whole.embed([whole.prepare_wave(waves[3])])).max()) > 1e-3


@pytest.mark.corpus
def test_equals_embed_utterance_on_real_speech(emb, encoder, corpus):
    """LibriSpeech (16 kHz, 6-20 s) and FSDD digits (8 kHz, resampled by spkflow's reader as in stage
    5): one batch equals Resemblyzer's embed_utterance(preprocess_wav(wav)) of each utterance alone."""
    from spkflow.data.resample import resample

    files = sorted(corpus("LIBRISPEECH").rglob("*.flac"))[::8][:6]
    files += sorted((corpus("FSDD") / "recordings").glob("*.wav"))[::300][:3]
    waves = []
    for f in files:
        x, sr = sf.read(f, dtype="float32")
        waves.append(resample(x, sr, 16000))
    got = emb.embed([emb.prepare_wave(w) for w in waves])
    ref = np.stack([resemblyzer_alone(encoder, w) for w in waves])
    # measured 6e-8 (1 thread)
    within("real speech: batched vs embed_utterance alone", float(np.abs(got - ref).max()), 1e-5)


def test_batched_equals_alone_one_forward(emb, monkeypatch):
    """A batch of mixed lengths is one forward of equal-length partials (no padding anywhere), and
    each utterance gets what it gets alone."""
    waves = synthetic()
    xs = [emb.prepare_wave(w) for w in waves]
    alone = np.concatenate([emb.embed([x]) for x in xs])
    shapes = []
    forward = emb.model.forward
    monkeypatch.setattr(emb.model, "forward", lambda mels: shapes.append(tuple(mels.shape)) or forward(mels))
    got = emb.embed(xs[::-1])[::-1]
    assert shapes == [(sum(x.shape[0] for x in xs) // 160, 160, 40)]
    # measured 2.1e-7 (1 thread)
    within("batched vs alone", float(np.abs(got - alone).max()), 1e-5)


def test_api_tells_the_toolkit_from_the_files(tmp_path, encoder):
    """The package's folder, its pretrained.pt, a copy of it in a folder of one's own: resemblyzer,
    told from the checkpoint's layout; the API's numbers are Resemblyzer's; ambiguous or foreign
    files are named, and the trimming option is Resemblyzer's only."""
    own = tmp_path / "models" / "resemblyzer"
    own.mkdir(parents=True)
    (own / "pretrained.pt").write_bytes((PKG / "pretrained.pt").read_bytes())
    for path in (PKG, PKG / "pretrained.pt", own):
        assert detect_toolkit(path) == "resemblyzer"
    e = Embedder.from_pretrained(own)
    assert (e.toolkit, e.dim, e.sample_rate) == ("resemblyzer", 256, 16000)
    w = synthetic()[4]
    ref = resemblyzer_alone(encoder, w)
    sf.write(tmp_path / "w.wav", w, 16000, subtype="FLOAT")  # the samples themselves
    within("API embed_file vs embed_utterance", float(np.abs(e.embed_file(tmp_path / "w.wav") - ref).max()), 1e-5)
    within("API embed vs embed_utterance", float(np.abs(e.embed(w, 16000) - ref).max()), 1e-5)
    got = e.embed_batch([w[:30000], w], 16000)
    within("API embed_batch vs embed_utterance", float(np.abs(got[1] - ref).max()), 1e-5)
    whole = Embedder.from_pretrained(PKG / "pretrained.pt", toolkit="resemblyzer", trim_silences=False)
    within(
        "API without trimming vs embed_utterance(normalize_volume(wav))",
        float(np.abs(whole.embed(w, 16000) - resemblyzer_alone(encoder, w, trim=False)).max()),
        1e-5,
    )
    # what is not Resemblyzer's, named
    torch.save({"model_state": {"weight": torch.zeros(2)}}, own / "other.pt")
    with pytest.raises(ModelError, match=r"several: other.pt pretrained.pt\); give the .pt file as the model"):
        model_files("resemblyzer", own)
    with pytest.raises(InputError, match=r"other.pt: not a Resemblyzer \(GE2E encoder\) checkpoint"):
        Embedder.from_pretrained(own / "other.pt")
    (own / "pretrained.pt").unlink()
    with pytest.raises(InputError, match="cannot tell the toolkit"):
        detect_toolkit(own)  # one .pt, but not an encoder's
    with pytest.raises(ValueError, match="--trim-silences is for --toolkit resemblyzer"):
        check_options("speechbrain", trim_silences=False)
    with pytest.raises(ValueError, match="--model-file is for --toolkit espnet or wespeaker"):
        check_options("resemblyzer", model_file=own / "other.pt")


def _encoder_state(seed: int) -> dict:
    """An encoder's ``model_state`` in Resemblyzer's layout with random weights (a checkpoint of its
    training code, e.g. Real-Time-Voice-Cloning's encoder.pt), with the GE2E loss's two scalars."""
    g = torch.Generator().manual_seed(seed)
    lstm, linear = torch.nn.LSTM(40, 256, 3, batch_first=True), torch.nn.Linear(256, 256)
    state = {f"lstm.{k}": torch.randn(v.shape, generator=g) * 0.1 for k, v in lstm.state_dict().items()}
    state |= {f"linear.{k}": torch.randn(v.shape, generator=g) * 0.1 for k, v in linear.state_dict().items()}
    return {"similarity_weight": torch.tensor([10.0]), "similarity_bias": torch.tensor([-5.0]), **state}


def test_weights_are_checked(tmp_path):
    """Another checkpoint of the same layout runs with its own weights (equal to VoiceEncoder loading
    it); a missing, unexpected or misshapen tensor, or a code-holding file, is refused naming the
    file (VoiceEncoder itself loads with strict=False)."""
    pt = tmp_path / "encoder.pt"
    torch.save({"step": 1, "model_state": _encoder_state(1)}, pt)
    w = synthetic()[2]
    ours = ResemblyzerEmbedder(pt)
    theirs = VoiceEncoder("cpu", verbose=False, weights_fpath=pt).embed_utterance(preprocess_wav(w))
    within(
        "another checkpoint vs VoiceEncoder(weights_fpath)",
        float(np.abs(ours.embed([ours.prepare_wave(w)]) - theirs).max()),
        1e-5,
    )
    assert ours.stamp != ResemblyzerEmbedder(PKG).stamp
    for change, message in (
        (lambda s: s.pop("linear.bias"), "missing linear.bias"),
        (lambda s: s.update(extra=torch.zeros(1)), "unexpected extra"),
        (
            lambda s: s.update({"lstm.weight_ih_l0": torch.zeros(1024, 80)}),
            r"lstm.weight_ih_l0 \(1024, 80\) vs \(1024, 40\)",
        ),
    ):
        state = _encoder_state(1)
        change(state)
        torch.save({"model_state": state}, pt)
        with pytest.raises(InputError, match=rf"encoder.pt: weights do not fit Resemblyzer's encoder: .*{message}"):
            ResemblyzerEmbedder(pt)
    torch.save({"model_state": _encoder_state(1), "why": Path("code")}, pt)  # a pickled object, not a tensor
    with pytest.raises(InputError, match="encoder.pt: holds pickled Python objects"):
        ResemblyzerEmbedder(pt)


def test_no_embedding_where_resemblyzer_gives_none(emb):
    """Digital silence (Resemblyzer's embed_utterance returns NaN) and noise in which webrtcvad finds
    no speech (Resemblyzer would embed its zero padding) are named; without trimming the noise is
    embedded whole."""
    with pytest.raises(ValueError, match="digital silence"):
        emb.prepare_wave(np.zeros(16000, dtype=np.float32))
    noise = (0.01 * np.random.default_rng(0).standard_normal(32000)).astype(np.float32)
    with pytest.raises(ValueError, match="webrtcvad found no speech"):
        emb.prepare_wave(noise)
    assert ResemblyzerEmbedder(PKG, trim_silences=False).prepare_wave(noise).shape == (2 * 160, 40)


def test_missing_extra_is_named(monkeypatch):
    """Without Resemblyzer installed, the error names the extra to install.  Mocked: only the import
    (``sys.modules`` entries set to None make ``import resemblyzer`` fail as when it is absent);
    the model path, detection and checkpoint reading are real."""
    for name in [m for m in sys.modules if m == "resemblyzer" or m.startswith("resemblyzer.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(rz_module, "_RZ", None)
    with pytest.raises(
        ModelError, match=r"pretrained.pt: --toolkit resemblyzer needs Resemblyzer: pip install .*\[resemblyzer\]"
    ):
        Embedder.from_pretrained(PKG)


@pytest.mark.slow
def test_script_nj2_equals_embed_utterance_resumes_only_with_the_same_trimming(tmp_path, encoder):
    """extract_embeddings.sh --toolkit resemblyzer --nj 2 with the package's folder as the model: each
    utterance equals Resemblyzer's embed_utterance(preprocess_wav(wav)) of the file; --trim-silences
    false is another model stamp (the earlier jobs' outputs are discarded, never mixed); an
    utterance of digital silence is listed in bad_utts with its reason (--skip-bad true); the option
    given for another toolkit is refused before anything runs."""
    data = make_speakers(tmp_path / "c", num_spk=2, num_utt=3, min_sec=0.8, max_sec=3.5)
    wav = dict(line.split(maxsplit=1) for line in (data / "wav.scp").read_text().splitlines())
    waves = {u: sf.read(p, dtype="float32")[0] for u, p in wav.items()}
    out = tmp_path / "out"
    utts, xv = extract("resemblyzer", PKG, data, out, "--batch-size", "4", "--num-threads", "1")
    worst = max(float(np.abs(xv[u] - resemblyzer_alone(encoder, waves[u])).max()) for u in utts)
    # measured 1.9e-7, and 2.1e-7 whole (1 thread)
    within("stage 5 vs embed_utterance(preprocess_wav(wav))", worst, 1e-5)
    assert (out / "jobs" / "model.stamp").read_text().strip() == ResemblyzerEmbedder(PKG).stamp
    again = ["--toolkit", "resemblyzer", "--nj", "2", "--trim-silences", "false", "--model-dir", PKG, data, out]
    p = subprocess.run(list(map(str, ["bash", SCRIPT, *again])), env=env(), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert "The model changed since" in p.stderr
    import kaldiio

    xv = kaldiio.load_scp(str(out / "xvector.scp"))
    worst = max(float(np.abs(xv[u] - resemblyzer_alone(encoder, waves[u], trim=False)).max()) for u in utts)
    within("stage 5 --trim-silences false vs embed_utterance(normalize_volume(wav))", worst, 1e-5)
    assert "trim_silences=false" in (out / "jobs" / "model.stamp").read_text()

    silent = tmp_path / "silent.wav"
    sf.write(silent, np.zeros(16000, dtype=np.float32), 16000, subtype="PCM_16")
    bad = write_data_dir_by_prefix(tmp_path / "bad", {**wav, "spk001-zz": str(silent)})
    args = ["--toolkit", "resemblyzer", "--nj", "1", "--skip-bad", "true", "--model-dir", PKG, bad, tmp_path / "o2"]
    p = subprocess.run(list(map(str, ["bash", SCRIPT, *args])), env=env(), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    listed = (tmp_path / "o2" / "bad_utts").read_text()
    assert listed.startswith(f"spk001-zz {silent}: digital silence") and len(listed.splitlines()) == 1
    other = ["--toolkit", "speechbrain", "--trim-silences", "false", "--model-dir", tmp_path, data, tmp_path / "o3"]
    p = subprocess.run(list(map(str, ["bash", SCRIPT, *other])), env=env(), capture_output=True, text=True)
    assert p.returncode == 1 and "--trim-silences is for --toolkit resemblyzer" in p.stderr


@pytest.mark.slow
def test_diarization_recipe_embeds_windows_whole(tmp_path, encoder, monkeypatch):
    """diar1's run.sh --pretrained <the package's folder> --pretrained_toolkit resemblyzer (the recipe's
    Resemblyzer peer, from the project's environment): stage 3 embeds each window of speech whole,
    as Resemblyzer's embed_utterance of its volume-normalised audio (its diarization demo trims the
    recording, never the windows).  Stages 4-5 on another toolkit's embeddings: test_diar_recipe.py."""
    import kaldiio

    from helpers.diar import make_conversations
    from helpers.recipes import linked_recipe
    from spkflow.data.audio import AudioReader

    recipe = linked_recipe(tmp_path, "diar1")
    (recipe / "data").mkdir()
    make_conversations(tmp_path / "conv", counts=(2,), duration=20.0).rename(recipe / "data" / "toy")
    args = [
        "--sets",
        "toy",
        "--stage",
        "2",
        "--stop_stage",
        "3",
        "--pretrained",
        PKG,
        "--pretrained_toolkit",
        "resemblyzer",
        "--tag",
        "rz",
    ]
    e = {k: v for k, v in env().items() if k != "PYTHONPATH"}  # path.sh sets it
    p = subprocess.run(["bash", "run.sh", *map(str, args)], cwd=recipe, env=e, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    exp = recipe / "exp" / "diar_rz"
    assert "trim_silences=false" in (exp / "embed" / "toy.oracle_w1.5s0.75" / "jobs" / "model.stamp").read_text()
    monkeypatch.chdir(recipe)  # the recipe's paths are relative to it
    windows = recipe / "dump" / "toy.oracle_w1.5s0.75" / "windows"
    reader = AudioReader(windows, sample_rate=16000)
    xv = kaldiio.load_scp(str(exp / "embed" / "toy.oracle_w1.5s0.75" / "xvector.scp"))
    keys = reader.keys()
    assert list(xv) == keys and len(keys) > 10
    worst = max(float(np.abs(xv[k] - resemblyzer_alone(encoder, reader.read(k), trim=False)).max()) for k in keys)
    # measured 1.8e-7 (1 thread)
    within("diar1 stage 3 vs embed_utterance(normalize_volume(window))", worst, 1e-5)
