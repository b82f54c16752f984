"""The raw-audio N x M loader (spkflow.train.raw_loader) and the trainer on it: real audio made here,
stage-2 arks from the real job code, real DataLoader workers, a tiny real training run."""

from __future__ import annotations

import dataclasses
import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import torch
import yaml

from helpers.audio import make_speakers, write_data_dir
from helpers.spread import THREADS, permuted, within
from spkflow.augment.sources import coloured_noise
from spkflow.augment.wave import WaveAugment, normalize_augment_config
from spkflow.data.ark import KaldiArkReader
from spkflow.data.audio import AudioReader
from spkflow.data.voiced import voiced_frames
from spkflow.features.fbank import FbankOptions, VadOptions
from spkflow.features.jobs import extract_job, merge_jobs
from spkflow.train.loader import NxMCropDataset, make_loader
from spkflow.train.raw_loader import CropFbank, NxMWaveDataset, samples_for_frames
from spkflow.train.state import partial_losses
from spkflow.train.stores import AudioFiles, FileCrops, InMemory

FB = FbankOptions(num_mel_bins=20)
SR = 16000


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Any]:
    """6 speakers x 4 utterances (FLAC), stage-2 features + VAD, a noise data dir, batch lists."""
    root = tmp_path_factory.mktemp("raw")
    data = make_speakers(root, num_spk=6, num_utt=4, fmt="flac", min_sec=0.5, max_sec=1.2)
    utts = [line.split()[0] for line in (data / "utt2spk").read_text().splitlines()]
    (root / "list").write_text("".join(u + "\n" for u in utts))
    feats = root / "feats"
    feats.mkdir()
    extract_job(data, root / "list", root / "arks", "train", 1, FB, VadOptions(), progress=False)
    merge_jobs(data, feats, root / "arks", "train", 1)
    (root / "noise").mkdir()
    rng = np.random.default_rng(0)
    path = root / "noise" / "pink.flac"
    sf.write(path, coloured_noise("pink", 3 * SR, rng), SR, subtype="PCM_16")
    noise = write_data_dir(root / "noise_dir", {"pink": str(path)}, {"pink": "pink"})
    by_spk = [utts[i : i + 4] for i in range(0, 24, 4)]
    batches = []
    for b in range(6):  # N=3 speakers x M=2, speaker-major
        spks = [(b + k) % 6 for k in range(3)]
        batches.append([u for s in spks for u in by_spk[s][b % 3 : b % 3 + 2]])
    return {"root": root, "data": data, "feats": feats, "noise": noise, "batches": batches, "utts": utts}


def test_samples_for_frames():
    for opts in (FB, FbankOptions(snip_edges=False)):
        from spkflow.features.fbank import num_frames

        for t in (1, 2, 57, 300):
            n = samples_for_frames(t, opts)
            assert num_frames(n, opts) == t and num_frames(n - 1, opts) < t


def test_unaugmented_raw_crops_equal_the_ark_crops_without_vad(corpus):
    ark = NxMCropDataset(
        corpus["feats"] / "feats.scp", corpus["batches"], seed=4, crop=(30, 60), use_vad=False, mean_norm="none"
    )
    raw = NxMWaveDataset(corpus["data"], corpus["batches"], fbank=FB, seed=4, crop=(30, 60), use_vad=False)
    worst = 0.0
    for b in range(len(ark)):
        x, u = ark[b]
        y, v, speed, counts = raw[b]
        assert u == v and x.shape == y.shape
        worst = max(worst, float((y - x).abs().max()))
        assert speed.shape == (len(u),) and not speed.any()  # num_utt=1: one "speaker" per crop
        assert counts == {"crops": len(u)}  # nothing applied without augment
    # same start frames, same per-frame fbank code (the mel product over another number of frames):
    # measured 0 (1 and 2 threads)
    within("raw crops vs stage 2's ark crops (log-mel)", worst, 1e-5)


def test_vad_crops_come_from_voiced_frames(corpus):
    ark = NxMCropDataset(corpus["feats"] / "feats.scp", corpus["batches"], seed=1, crop=40, mean_norm="none")
    raw = NxMWaveDataset(
        corpus["data"], corpus["batches"], fbank=FB, seed=1, crop=40, vad_scp=corpus["feats"] / "vad.scp"
    )
    same = total = 0
    for b in range(len(ark)):
        x, y = ark[b][0], raw[b][0]
        close = (x - y).abs().amax(dim=2) < 1e-3
        same += int(close.sum())
        total += close.numel()
    # frames inside a voiced run are the ark path's frames exactly; those straddling a join differ
    assert same / total > 0.7, same / total


def test_crop_mean_norm_and_bad_inputs(corpus, tmp_path):
    raw = NxMWaveDataset(corpus["data"], corpus["batches"], fbank=FB, crop=30, mean_norm="crop", use_vad=False)
    x = raw[0][0]
    assert torch.allclose(x.mean(dim=1), torch.zeros(x.shape[0], x.shape[2]), atol=1e-4)
    with pytest.raises(ValueError, match="mean_norm"):
        NxMWaveDataset(corpus["data"], corpus["batches"], fbank=FB, mean_norm="utterance", use_vad=False)
    from spkflow.core.errors import InputError

    with pytest.raises(InputError, match=r"wav\.scp: utterance 'nope' of batch 0 \(line 1 of the batch list\)"):
        NxMWaveDataset(corpus["data"], [["nope"]], fbank=FB, use_vad=False)

    with pytest.raises(InputError, match="vad.scp"):
        NxMWaveDataset(corpus["data"], corpus["batches"], fbank=FB)  # no vad.scp in the data dir


def augmenter(corpus, speed=(0.9, 1.0, 1.1)) -> WaveAugment:
    cfg = normalize_augment_config(
        {
            "speed": {"factors": list(speed)},
            "noise": {
                "prob": 0.7,
                "data_dirs": {"noise": str(corpus["noise"]), "babble": str(corpus["data"])},
                "num_sources": {"babble": [2, 3]},
            },
            "band": {"prob": 0.3},
            "gain": {"prob": 0.5},
        }
    )
    return WaveAugment(cfg, SR)


def test_augmented_batches_are_deterministic_resumable_any_workers(corpus):
    def make(seed: int = 7, epoch: int = 2) -> NxMWaveDataset:
        return NxMWaveDataset(
            corpus["data"],
            corpus["batches"],
            fbank=FB,
            seed=seed,
            epoch=epoch,
            crop=(30, 50),
            vad_scp=corpus["feats"] / "vad.scp",
            augment=augmenter(corpus),
            num_utt=2,
        )

    d = make()
    ref = [d[b] for b in range(len(d))]
    again = d[3]
    assert torch.equal(again[0], ref[3][0]) and torch.equal(again[2], ref[3][2])  # same batch twice
    for workers, start in ((2, 0), (1, 4), (0, 2)):
        got = list(make_loader(d, start_batch=start, num_workers=workers, prefetch_factor=2))
        assert len(got) == len(d) - start
        for (x, u, s, c), (y, v, t, n) in zip(got, ref[start:], strict=True):
            assert u == v and torch.equal(x, y) and torch.equal(s, t) and c == n  # counts too
    for b, (x, _, s, c) in enumerate(ref):
        assert x.shape == (6, d.crop_length(b), FB.dim) and torch.isfinite(x).all()
        assert s.shape == (3,) and 0 <= int(s.min()) and int(s.max()) < 3
        assert c["crops"] == 6 and c.get("speed", 0) == 2 * int((s != 1).sum())  # factor index 1 is 1.0
        assert c.get("noise", 0) == sum(v for k, v in c.items() if k.startswith("noise."))
    assert sum(c.get(op, 0) for *_, c in ref for op in ("reverb", "noise", "band", "gain")) > 0
    assert not torch.equal(make(epoch=3)[0][0][:, :30], ref[0][0][:, :30])
    assert not torch.equal(make(seed=8)[0][0][:, :30], ref[0][0][:, :30])
    plain = NxMWaveDataset(
        corpus["data"], corpus["batches"], fbank=FB, seed=7, epoch=2, crop=(30, 50), vad_scp=corpus["feats"] / "vad.scp"
    )
    assert not torch.equal(plain[0][0], ref[0][0])  # the augmentation does change the features


@pytest.mark.parametrize("mean_norm", ["none", "crop"])
def test_fbank_on_device_gives_the_workers_batches(corpus, mean_norm):
    """fbank_on="device": the workers hand over the augmented waveform crops, CropFbank computes
    the features batched (on the CPU here) and equals the workers' fbank + mean_norm."""

    def make(fbank_on: str) -> NxMWaveDataset:
        return NxMWaveDataset(
            corpus["data"],
            corpus["batches"],
            fbank=FB,
            seed=3,
            epoch=1,
            crop=(30, 50),
            vad_scp=corpus["feats"] / "vad.scp",
            mean_norm=mean_norm,
            augment=augmenter(corpus),
            num_utt=2,
            fbank_on=fbank_on,
        )

    workers, device = make("workers"), make("device")
    crop_fbank = CropFbank(FB.to_dict(), mean_norm)
    got = list(make_loader(device, num_workers=2, prefetch_factor=2))
    assert len(got) == len(workers)
    worst = 0.0
    for b, (w, u, s, c) in enumerate(got):
        x, v, t, n = workers[b]
        assert w.shape == (6, samples_for_frames(workers.crop_length(b), FB))  # waveforms, not features
        assert u == v and torch.equal(s, t) and c == n
        worst = max(worst, float((crop_fbank(w) - x).abs().max()))
    within("crops' fbank on the device vs in the workers (log-mel)", worst, 1e-4)  # measured <= 2.9e-6 (1, 2 threads)
    with pytest.raises(ValueError, match="fbank_on"):
        make("gpu")


def train_config(corpus: dict[str, Any], augment: dict[str, Any]) -> dict[str, Any]:
    return {
        "frontend": {"vad": True, "mean_norm": False, "feats_type": "raw"},
        "model": {"name": "ecapa_tdnn", "channels": 16, "scale": 4, "embed_dim": 8},
        "loss": {"name": "aamsoftmax", "margin": 0.2, "scale": 30},
        "optim": {"name": "adam", "lr": 0.01},
        "scheduler": {"name": "constant"},
        "train": {"crop_min_frames": 20, "crop_max_frames": 30, "input_stats_utts": 10, "num_workers": 2},
        "augment": augment,
    }


def test_trainer_on_raw_augmented_audio_resumes_exactly(corpus, tmp_path):
    """A tiny AAM run on augmented raw crops (speed perturbed speakers as new classes): stopped
    mid-epoch and resumed, it ends with the weights of an uninterrupted run."""
    from spkflow.train.trainer import Trainer, TrainOptions

    torch.set_num_threads(THREADS)
    bdir = tmp_path / "batches"
    bdir.mkdir()
    for e in (1, 2):
        lines = permuted([" ".join(b) + "\n" for b in corpus["batches"][e - 1 :: 2]])
        (bdir / f"epoch{e}.txt").write_text("".join(lines))
    utts = corpus["utts"]
    spk = {u: u.split("-")[0] for u in utts}
    trials = [f"{a} {b} {'target' if spk[a] == spk[b] else 'nontarget'}\n" for a, b in itertools.combinations(utts, 2)]
    (corpus["data"] / "trials").write_text("".join(trials))
    aug = {
        "speed": {"factors": [0.9, 1.0, 1.1]},
        "noise": {"prob": 0.5, "data_dirs": {"noise": str(corpus["noise"]), "babble": str(corpus["data"])}},
        "gain": {"prob": 0.5},
    }

    def opts(out: Path, **kw: Any) -> TrainOptions:
        return TrainOptions(
            config=train_config(corpus, aug),
            train_data=str(corpus["data"]),
            train_feats=str(corpus["feats"]),
            batches_dir=str(bdir),
            out_dir=str(out),
            num_epochs=2,
            num_utt=2,
            valid_data=str(corpus["data"]),
            valid_feats=str(corpus["feats"]),
            device="cpu",
            progress=False,
            **kw,
        )

    Trainer(opts(tmp_path / "full")).run()
    part = partial_losses(Trainer(opts(tmp_path / "part", max_steps=2)).run(), 1)
    Trainer(opts(tmp_path / "part")).run()
    a = torch.load(tmp_path / "full" / "model.pth", weights_only=True)
    b = torch.load(tmp_path / "part" / "model.pth", weights_only=True)
    assert list(a) == list(b) and all(torch.equal(b[k], a[k]) for k in a)  # exact: the same steps on the same crops
    ck = torch.load(tmp_path / "full" / "checkpoint.pth", weights_only=True)
    assert ck["loss"]["inner.weight"].shape[0] == 6 * 3  # 6 speakers x 3 speed factors
    hist = json.loads((tmp_path / "full" / "history.json").read_text())["history"]
    assert len(hist) == 2 and all(np.isfinite(h["train_loss"]) for h in hist)
    import yaml

    saved = yaml.safe_load((tmp_path / "full" / "config.yaml").read_text())
    assert saved["frontend"]["feats_type"] == "raw" and saved["augment"]["noise"]["snr"]["babble"] == [13.0, 20.0]
    assert saved["train"]["fbank_on"] == "auto"  # on the CPU: in the workers
    # train.fbank_on device: the crops' fbank in the training process (the GPU path, all crops of a
    # batch at once) instead of one crop at a time in the workers: the same first step up to float
    # rounding.  Only step 1 is compared, on the same initial weights: after it Adam (lr 0.01, its
    # first steps near lr * sign(grad)) amplifies 1e-6 input differences (epoch 1's mean loss over 3
    # steps: 1.4e-5 relative here, 1.0e-5 on an AMD box; epoch 2's: 1.4%), which says nothing of the fbank.
    cfg = train_config(corpus, aug)
    cfg["train"]["fbank_on"] = "device"
    dev = partial_losses(Trainer(dataclasses.replace(opts(tmp_path / "device", max_steps=1), config=cfg)).run(), 1)
    # relative: the AAM scale (30) multiplies the logits' rounding; measured <= 2.8e-7 (1 and 2 threads,
    # batch order permuted), so 1e-5 keeps a 36x margin
    within("raw trainer step-1 loss, fbank on device vs workers", abs(dev[0] - part[0]) / abs(part[0]), 1e-5)
    from spkflow.core.checks import ConfigError

    cfg["train"]["fbank_on"] = "gpu"
    with pytest.raises(ConfigError, match="train.fbank_on"):
        Trainer(dataclasses.replace(opts(tmp_path / "bad"), config=cfg))


def test_speed_classes_without_perturbation(corpus):
    """augment.speed.perturb false (large-margin fine-tuning): every speaker is labelled with
    factor 1.0's class and no crop is resampled: the crops equal those without speed factors."""
    kw = dict(fbank=FB, seed=7, epoch=2, crop=(30, 50), vad_scp=corpus["feats"] / "vad.scp", num_utt=2)
    cfg = normalize_augment_config({"speed": {"factors": [0.9, 1.0, 1.1], "perturb": False}})
    fixed = NxMWaveDataset(corpus["data"], corpus["batches"], augment=WaveAugment(cfg, SR), **kw)
    plain = NxMWaveDataset(corpus["data"], corpus["batches"], **kw)
    for b in range(len(fixed)):
        x, _, s, c = fixed[b]
        assert s.tolist() == [1] * len(s) and c.get("speed", 0) == 0
        assert torch.equal(x, plain[b][0])


def test_trainer_on_audio_reads_no_stage2_output(corpus, tmp_path):
    """A config that trains on audio alone (feats_type raw, no VAD, input_norm none) trains from
    a data dir without feats.scp or vad.scp: the input dimension comes from the fbank options;
    with VAD (or global input statistics) the missing file is named with the key that needs it."""
    from spkflow.core.errors import InputError
    from spkflow.train.data import features_needed
    from spkflow.train.trainer import Trainer, TrainOptions

    torch.set_num_threads(1)
    data = tmp_path / "data"
    data.mkdir()
    for f in ("wav.scp", "utt2spk", "spk2utt"):
        (data / f).write_text((corpus["data"] / f).read_text())
    bdir = tmp_path / "batches"
    bdir.mkdir()
    (bdir / "epoch1.txt").write_text("".join(" ".join(b) + "\n" for b in corpus["batches"][:4]))
    fbank_conf = tmp_path / "fbank.conf"
    fbank_conf.write_text(FB.to_kaldi_conf())
    cfg = train_config(corpus, {"speed": {"factors": [0.9, 1.0, 1.1]}})
    cfg["frontend"]["vad"] = False
    cfg["model"]["input_norm"] = "none"
    cfg["train"]["num_workers"] = 0

    def opts(config: dict, out: str) -> TrainOptions:
        return TrainOptions(
            config=config,
            train_data=str(data),
            train_feats=str(data),
            batches_dir=str(bdir),
            out_dir=str(tmp_path / out),
            num_epochs=1,
            num_utt=2,
            fbank_conf=str(fbank_conf),
            device="cpu",
            progress=False,
        )

    from spkflow.train.config import normalize_train_config

    assert features_needed(normalize_train_config(cfg)) == []
    Trainer(opts(cfg, "exp")).run()
    saved = yaml.safe_load((tmp_path / "exp" / "config.yaml").read_text())
    assert saved["model"]["input_dim"] == FB.dim and (tmp_path / "exp" / "model.pth").is_file()
    with_vad = {**cfg, "frontend": {**cfg["frontend"], "vad": True}}
    with pytest.raises(
        InputError, match=rf"{data / 'feats.scp'}: not found, and frontend\.vad \(stage 2's vad\.scp\) needs it"
    ):
        Trainer(opts(with_vad, "vad")).run()


def _copy_as(corpus, name: str, fmt: str, subtype: str) -> Path:
    """The corpus's data dir with every file written again as ``fmt`` / ``subtype`` (same samples)."""
    root = corpus["root"] / name
    if root.is_dir():
        return root / "data"
    wav = {}
    for line in (corpus["data"] / "wav.scp").read_text().splitlines():
        utt, path = line.split(maxsplit=1)
        x, rate = sf.read(path, dtype="float32")
        out = root / "audio" / f"{utt}.{fmt}"
        out.parent.mkdir(parents=True, exist_ok=True)
        sf.write(out, x, rate, subtype=subtype)
        wav[utt] = str(out)
    u2s = dict(line.split() for line in (corpus["data"] / "utt2spk").read_text().splitlines())
    return write_data_dir(root / "data", wav, u2s)


def _segmented(corpus) -> Path:
    """The corpus's recordings cut by ``segments`` (from 0.05 s; to the end, or to 0.1 s before
    it), with their own stage-2 VAD (``feats/vad.scp`` inside)."""
    d = corpus["root"] / "segmented"
    if not d.is_dir():
        shutil.copytree(corpus["data"], d)
        lines = []
        for i, line in enumerate((d / "wav.scp").read_text().splitlines()):
            utt, path = line.split(maxsplit=1)
            end = -1 if i % 2 else round(sf.info(path).duration - 0.1, 3)
            lines.append(f"{utt} {utt} 0.05 {end}\n")
        (d / "segments").write_text("".join(lines))
        (d / "feats").mkdir()
        extract_job(d, corpus["root"] / "list", d / "arks", "train", 1, FB, VadOptions(), progress=False)
        merge_jobs(d, d / "feats", d / "arks", "train", 1)
    return d


SPAN_CASES = [  # (data dir, files in wav.scp, use the VAD)
    ("flac16", "flac", "PCM_16", True),
    ("flac16", "flac", "PCM_16", False),
    ("flac24", "flac", "PCM_24", True),
    ("wav16", "wav", "PCM_16", True),
    ("wav16", "wav", "PCM_16", False),
    ("wavfloat", "wav", "FLOAT", True),
    ("segments", "flac", "PCM_16", True),
    ("segments", "flac", "PCM_16", False),
]


@pytest.mark.parametrize(("name", "fmt", "subtype", "use_vad"), SPAN_CASES)
def test_crops_read_by_span_equal_the_whole_file_crops(corpus, monkeypatch, name, fmt, subtype, use_vad):
    """A crop read from its file by seeking (only the span its samples need, VAD positions mapped
    to the file's) has the samples of the whole file decoded then indexed, bit for bit: WAV and
    FLAC, with and without the VAD, speed factors, crops that wrap around, segments.  With the
    cache off every crop is a span read; nothing enters the cache."""
    from spkflow.augment.wave import DecodedAudioCache
    from spkflow.train import stores

    data = (
        _segmented(corpus)
        if name == "segments"
        else corpus["data"]
        if name == "flac16"
        else _copy_as(corpus, name, fmt, subtype)
    )
    cache = DecodedAudioCache(0)  # SPKFLOW_AUDIO_CACHE_MB=0 (VoxCeleb's setting): nothing kept
    monkeypatch.setattr(stores, "AUDIO_CACHE", cache)
    speed = WaveAugment(normalize_augment_config({"speed": {"factors": [0.9, 1.0, 1.1]}}), SR)
    batches = corpus["batches"] * 3  # more draws of speed factors and crop starts

    def make(span_reads: bool) -> NxMWaveDataset:
        return NxMWaveDataset(
            AudioFiles(data, SR, span_reads=span_reads),
            batches,
            fbank=FB,
            seed=3,
            crop=(40, 110),
            use_vad=use_vad,
            vad_scp=(data / "feats" if name == "segments" else corpus["feats"]) / "vad.scp",
            augment=speed,
            num_utt=2,
            fbank_on="device",  # the crops' samples themselves
        )

    span, whole = make(True), make(False)
    reader = AudioReader(data, sample_rate=SR)
    vad = KaldiArkReader((data / "feats" if name == "segments" else corpus["feats"]) / "vad.scp")
    shift = FB.window_shift
    for u in corpus["utts"]:
        got = span.store.samples(u)
        wave = reader.read(u)
        assert isinstance(got, FileCrops) and len(got) == len(wave)  # the header's length
        # the voiced waveform built whole, as the loader built it before reading spans
        keep = voiced_frames(vad.read(u)) if use_vad else None
        stream = (
            wave
            if keep is None
            else wave[np.minimum((keep[:, None] * shift + np.arange(shift)).ravel(), len(wave) - 1)]
        )
        for start in (0, 7, len(stream) // shift - 3):  # the last wraps around
            want = stream[(start * shift + np.arange(4000)) % len(stream)]
            assert np.array_equal(span.crop(u, start, 4000), want), (u, start)
    wraps = fits = perturbed = 0
    for b in range(len(span)):
        T = span.crop_length(b)
        frames = [span._stream(u)[2] for u in batches[b]]
        wraps += sum(n < T for n in frames)
        fits += sum(n > T + 20 for n in frames)
        x, u, s, c = span[b]
        y, v, t, d = whole[b]
        assert u == v and torch.equal(s, t) and c == d
        assert torch.equal(x, y), (name, use_vad, b)
        perturbed += int(s.ne(1).sum())  # factor index 1 is 1.0
    assert wraps and fits and perturbed
    assert cache.misses == len(batches) * 6 and cache.hits == 0 and not cache._items  # the whole-file path's


def test_the_cache_rule(corpus, monkeypatch, tmp_path):
    """A file in the decoded-audio cache is cropped from memory; one that is not is decoded whole
    and kept while the cache has room for it, else read by span and not inserted (nothing is
    dropped for it); a rate to resample or a format without exact seeking is decoded whole."""
    from spkflow.augment.wave import DecodedAudioCache
    from spkflow.core.errors import UtteranceError
    from spkflow.train import stores

    cache = DecodedAudioCache(64)
    monkeypatch.setattr(stores, "AUDIO_CACHE", cache)
    store = AudioFiles(corpus["data"], SR)
    u, w = corpus["utts"][:2]
    assert isinstance(store.samples(u), InMemory) and len(cache._items) == 1  # room: decoded once, kept
    cache.max_bytes = cache._bytes + 1000  # full: no room for another file
    assert isinstance(store.samples(w), FileCrops) and len(cache._items) == 1  # read by span, not kept
    kept = store.samples(u)
    assert isinstance(kept, InMemory) and cache.hits == 1 and isinstance(store.samples(w), FileCrops)
    pos = np.array([5, 3, 900, 4])
    audio = AudioReader(corpus["data"])
    assert np.array_equal(kept.take(pos), audio.read(u)[pos])
    assert np.array_equal(store.samples(w).take(pos), audio.read(w)[pos]) and len(cache._items) == 1
    # another rate (resampled) or OGG (no exact seeking): decoded whole, through the cache
    x, _ = sf.read(audio.entry(u), dtype="float32")
    sf.write(tmp_path / "a.flac", x, 8000)
    sf.write(tmp_path / "b.ogg", x, SR)
    other = write_data_dir(
        tmp_path / "d", {"a": str(tmp_path / "a.flac"), "b": str(tmp_path / "b.ogg")}, {"a": "s", "b": "s"}
    )
    store = AudioFiles(other, SR)
    for k in ("a", "b"):
        assert isinstance(store.samples(k), InMemory)
    assert cache.misses == 3
    # a FLAC cut short: its header promises samples it does not hold; the crop that reaches them is named
    cut = tmp_path / "cut.flac"
    raw = Path(audio.entry(u)).read_bytes()
    cut.write_bytes(raw[: len(raw) // 2])
    store = AudioFiles(write_data_dir(tmp_path / "c", {"c": str(cut)}, {"c": "s"}), SR)
    got = store.samples("c")
    with pytest.raises(UtteranceError, match=r"'c'.*cut\.flac"):
        got.take(np.arange(len(got) - 400, len(got)))
