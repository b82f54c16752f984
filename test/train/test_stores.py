"""The training stores (spkflow.train.stores): one suite over every kind of storage.

Feature stores (stage 2's arks, shards of every frame, shards of the voiced frames) and audio
stores (the data dir's files, shards of them), on real audio made here, real fbank arks from the
feature job code and real shards from the shard job code.  For every kind: batch k is the same
bit for bit (against a reference computed here from kaldiio's reading of the arks / the decoded
audio), a run resumed at batch k in DataLoader workers gives the batches of an uninterrupted one,
and bad input (an utterance the store lacks, damaged bytes) is named."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import kaldiio
import numpy as np
import pytest
import torch

from helpers.audio import make_speakers
from spkflow.core.errors import InputError, UtteranceError
from spkflow.data.audio import AudioReader
from spkflow.data.shard_jobs import merge, prepare, write_job
from spkflow.data.shards import ShardSet
from spkflow.data.tables import read_kv
from spkflow.data.voiced import voiced_frames
from spkflow.features.fbank import FbankOptions, VadOptions, compute_fbank, num_frames
from spkflow.features.jobs import extract_job, merge_jobs, write_split
from spkflow.train.batches import crop_frames, plan_epoch
from spkflow.train.loader import _LOADER_PURPOSE, NxMCropDataset, make_loader
from spkflow.train.raw_loader import NxMWaveDataset, samples_for_frames
from spkflow.train.shard_plan import plan_shard_epoch, read_utt2shard
from spkflow.train.stores import ArkStore, AudioFiles, AudioShards, FeatureShards

FB = FbankOptions(num_mel_bins=24)
FEATURES = ["arks", "shards", "voiced-shards"]
AUDIO = ["audio-files", "audio-shards"]
KINDS = FEATURES + AUDIO
SEED, EPOCH, CROP = 1, 3, (30, 50)


def _shards(src: Path, out: Path, **kw: Any) -> Path:
    prepare(src, out, 10, run=4, seed=0, **kw)
    for j in (1, 2):
        write_job(src, out, j, 2, audio=kw.get("audio", False))
    merge(out, 2)
    return out / "shards.list"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict[str, Any]:
    """8 speakers x 6 FLAC files, their float fbank + VAD + statistics (the feature job code),
    shards of every frame, of the voiced frames and of the audio files, and a shard plan (the
    three shard sets share their plan: the same utterances in the same shards)."""
    root = tmp_path_factory.mktemp("stores")
    data = make_speakers(root, num_spk=8, num_utt=6, min_sec=0.6, max_sec=1.4, fmt="flac")
    feats = root / "fbank"
    split = write_split(data, feats / "split", 1)
    extract_job(data, split[0], feats / "data", "t", 1, FB, VadOptions(), compress=False, progress=False)
    merge_jobs(data, feats, feats / "data", "t", 1)
    for f in ("utt2spk", "spk2utt"):
        shutil.copy(data / f, feats / f)
    lists = {
        "shards": _shards(feats, root / "all"),
        "voiced-shards": _shards(feats, root / "voiced", voiced=True),
        "audio-shards": _shards(data, root / "audio", audio=True),
    }
    u2s = read_utt2shard(root / "all" / "utt2shard")
    assert u2s == read_utt2shard(root / "voiced" / "utt2shard") == read_utt2shard(root / "audio" / "utt2shard")
    plan = plan_shard_epoch(data / "spk2utt", u2s, 4, 2, seed=SEED, epoch=EPOCH, pool=2)
    assert len(plan) >= 3
    return {"root": root, "data": data, "feats": feats, "lists": lists, "batches": plan.batches}


def open_store(c: dict[str, Any], kind: str, use_vad: bool = True) -> Any:
    known = read_kv(c["data"] / "utt2spk")
    if kind == "arks":
        return ArkStore(c["feats"] / "feats.scp", use_vad=use_vad)
    if kind in ("shards", "voiced-shards"):
        return FeatureShards(c["lists"][kind], use_vad=use_vad, known_utts=known, max_shards=2)
    if kind == "audio-files":
        return AudioFiles(c["data"], 16000)
    return AudioShards(c["lists"][kind], 16000, known_utts=known, max_shards=2)


def dataset(c: dict[str, Any], kind: str, store: Any = None, batches: Any = None) -> Any:
    store = store if store is not None else open_store(c, kind)
    batches = c["batches"] if batches is None else batches
    if kind in FEATURES:
        return NxMCropDataset(store, batches, seed=SEED, epoch=EPOCH, crop=CROP, mean_norm="utterance")
    return NxMWaveDataset(store, batches, fbank=FB, seed=SEED, epoch=EPOCH, crop=CROP, use_vad=False, num_utt=2)


def _starts(n: np.ndarray, T: int, b: int) -> list[int]:
    """The crop starts as the loaders draw them (one generator per (seed, epoch, batch))."""
    rng = np.random.default_rng([SEED, EPOCH, b, _LOADER_PURPOSE])
    return rng.integers(0, np.where(n >= T, n - T + 1, n)).tolist()


def reference(c: dict[str, Any], kind: str, b: int) -> torch.Tensor:
    """Batch ``b`` computed here, from kaldiio's reading of the arks (voiced frames by the VAD,
    the mean from the voiced statistics) or from the decoded audio (fbank of the crop's samples)."""
    utts, T = c["batches"][b], crop_frames(SEED, EPOCH, b, *CROP)
    if kind in FEATURES:
        d = c["feats"]
        mats, vad = kaldiio.load_scp(str(d / "feats.scp")), kaldiio.load_scp(str(d / "vad.scp"))
        stats = kaldiio.load_scp(str(d / "cmvn_utt_voiced.scp"))
        frames = []
        for u in utts:
            keep = voiced_frames(np.asarray(vad[u]))
            frames.append(mats[u] if keep is None else mats[u][keep])
        n = np.array([len(f) for f in frames])
        out = np.empty((len(utts), T, FB.dim), np.float32)
        for i, (u, s) in enumerate(zip(utts, _starts(n, T, b), strict=True)):
            st = np.asarray(stats[u])
            out[i] = frames[i][(s + np.arange(T)) % n[i]] - (st[0, :-1] / st[0, -1]).astype(np.float32)
        return torch.from_numpy(out)
    audio = AudioReader(c["data"], sample_rate=16000)
    waves = [audio.read(u) for u in utts]
    n = np.array([num_frames(len(w), FB) for w in waves])
    need = samples_for_frames(T, FB)
    out = np.empty((len(utts), T, FB.dim), np.float32)
    for i, (w, s) in enumerate(zip(waves, _starts(n, T, b), strict=True)):
        pos = s * FB.window_shift + np.arange(need)
        out[i] = compute_fbank(w[pos % len(w)], 16000, FB)[:T]
    return torch.from_numpy(out)


@pytest.mark.parametrize("kind", KINDS)
def test_batch_k_is_the_same_from_every_store(corpus, kind):
    """Batch k from each kind of storage equals the one computed here from the arks or the
    audio, bit for bit; shard stores hold no more than the plan's window of shards."""
    ds = dataset(corpus, kind)
    for b in range(len(ds)):
        got = ds[b]
        assert got[1] == corpus["batches"][b]
        assert torch.equal(got[0], reference(corpus, kind, b)), f"batch {b} from {kind}"
    if kind.endswith("shards"):
        reads = ds.store.reads
        assert reads.peak <= 2 * reads.max_shards and reads.max_shards <= 2
        assert set(reads.loaded) == set(reads.needs[-1])  # each shard dropped after its last batch
        held = sum(len(reads.shards.utts_of[i]) for i in reads.loaded)
        assert kind == "audio-shards" or len(ds.store.feats) == held  # and its records with it
    if kind == "voiced-shards":
        assert ds.store.voiced  # the crops came from voiced-frame records, whose rows are all kept


@pytest.mark.parametrize("kind", KINDS)
def test_resume_in_workers_gives_the_uninterrupted_batches(corpus, kind):
    """Batches 1.. of a loader started at batch 1 with two workers (each reading its own shards)
    are those of an uninterrupted run in this process; the store opened in the parent is
    forked and pickled without what it held."""
    ds = dataset(corpus, kind)
    full = [x.clone() for x, *_ in make_loader(ds, num_workers=0)]  # this process holds shards now
    resumed = [x.clone() for x, *_ in make_loader(ds, start_batch=1, num_workers=2)]
    assert len(resumed) == len(full) - 1
    assert all(torch.equal(a, b) for a, b in zip(full[1:], resumed, strict=True))
    spawned = [x.clone() for x, *_ in make_loader(ds, start_batch=2, num_workers=1, multiprocessing_context="spawn")]
    assert all(torch.equal(a, b) for a, b in zip(full[2:], spawned, strict=True))


@pytest.mark.parametrize("kind", KINDS)
def test_an_utterance_the_store_lacks_is_named_with_its_line(corpus, kind):
    batches = [list(corpus["batches"][0]), list(corpus["batches"][1])]
    batches[1][3] = "spk999-nobody"
    with pytest.raises(InputError, match=r"utterance 'spk999-nobody' of batch 1 \(line 2 of the batch list\)") as e:
        dataset(corpus, kind, batches=batches)
    assert e.value.path == open_store(corpus, kind).name  # the store's own list: feats.scp, shards.list, wav.scp


def _damage(c: dict[str, Any], kind: str, tmp: Path) -> tuple[Any, str]:
    """A copy of the kind's storage with the bytes of the first batch's first utterance damaged;
    the store over it and what the error must say."""
    utt = c["batches"][0][0]
    if kind == "arks":  # an ark cut short inside the utterance's record
        scp = kaldiio.load_scp(str(c["feats"] / "feats.scp"))
        rows = {u: np.asarray(scp[u]) for u in sorted(scp, key=lambda u: u == utt)}  # the utterance last
        kaldiio.save_ark(str(tmp / "feats.ark"), rows, scp=str(tmp / "feats.scp"))
        for name in ("vad.scp", "cmvn_utt_voiced.scp"):
            shutil.copy(c["feats"] / name, tmp / name)
        off = int(
            next(x for x in (tmp / "feats.scp").read_text().split("\n") if x.startswith(utt + " ")).split(":")[-1]
        )
        with open(tmp / "feats.ark", "r+b") as f:
            f.truncate(off + 100)
        return ArkStore(tmp / "feats.scp"), rf"{utt}.*truncated.*feats\.ark"
    if kind == "audio-files":  # the file gone
        (tmp / "data").mkdir()
        wav = read_kv(c["data"] / "wav.scp")
        shutil.copy(wav[utt], tmp / "gone.flac")
        (tmp / "gone.flac").unlink()
        lines = [f"{u} {tmp / 'gone.flac' if u == utt else p}\n" for u, p in sorted(wav.items())]
        (tmp / "data" / "wav.scp").write_text("".join(lines))
        shutil.copy(c["data"] / "utt2spk", tmp / "data" / "utt2spk")
        return AudioFiles(tmp / "data", 16000), rf"{utt}.*gone\.flac"
    # shards: 1,000 bytes flipped inside the utterance's feature (or audio) member
    src = Path(c["lists"][kind]).parent
    shutil.copytree(src, tmp / "sh")
    shards = ShardSet(tmp / "sh" / "shards.list")
    shard = shards.load(shards.utt2shard[utt])
    field = {"shards": "feats", "voiced-shards": "feats_voiced"}.get(kind) or shard.audio_field(utt)
    off, size = shard.offsets[field][utt], shard.sizes[field][utt]
    path = Path(shards.path(shards.utt2shard[utt]))
    raw = bytearray(path.read_bytes())
    lo = off + 40
    raw[lo : lo + min(1000, size - 40)] = bytes(x ^ 0xFF for x in raw[lo : lo + min(1000, size - 40)])
    path.write_bytes(bytes(raw))
    store = AudioShards(shards, 16000, max_shards=2) if kind == "audio-shards" else FeatureShards(shards, max_shards=2)
    return store, rf"{path.name}: member '{utt}\.{field}' fails its checksum"


@pytest.mark.parametrize("kind", KINDS)
def test_damaged_storage_is_named(corpus, kind, tmp_path):
    """Damaged bytes under the first batch stop the batch with an error naming the file and the
    utterance (shards: the shard and its member), in this process and through a worker."""
    store, want = _damage(corpus, kind, tmp_path)
    with pytest.raises((InputError, UtteranceError, OSError), match=want) as here:
        dataset(corpus, kind, store=store)[0]
    there = worker_error(dataset(corpus, kind, store=store))
    assert there == f"{here.type.__name__}: {here.value}"  # the same error, as itself, through a worker


def worker_error(ds: Any) -> str:
    """The error batch 0 raises through a DataLoader worker, as text (the error is not kept: the
    loader and its workers, which ignore SIGTERM as the trainer's do, end when it is dropped)."""
    try:
        next(iter(make_loader(ds, num_workers=1)))
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    raise AssertionError("batch 0 was read")


def test_a_list_planned_for_random_access_is_refused(corpus):
    plan = plan_epoch(corpus["data"] / "spk2utt", 8, 2, seed=0, epoch=1)
    with pytest.raises(InputError, match="plan the batch lists for shards"):
        NxMCropDataset(FeatureShards(corpus["lists"]["shards"], max_shards=2), plan.batches, crop=20)


def test_voiced_shards_cannot_train_without_the_vad(corpus):
    """Shards of the voiced frames cannot give every frame: said, naming a shard, with the fix."""
    ds = NxMCropDataset(
        FeatureShards(corpus["lists"]["voiced-shards"], use_vad=False, max_shards=2),
        corpus["batches"],
        crop=20,
        mean_norm="none",
    )
    with pytest.raises(InputError, match=r"shard\.\d+\.tar.*voiced frames only.*--voiced false"):
        ds[0]
    every = NxMCropDataset(open_store(corpus, "shards", use_vad=False), corpus["batches"], crop=20, mean_norm="none")
    arks = NxMCropDataset(open_store(corpus, "arks", use_vad=False), corpus["batches"], crop=20, mean_norm="none")
    assert torch.equal(every[0][0], arks[0][0])
    with pytest.raises(ValueError, match="use_vad=True but the store"):
        NxMCropDataset(open_store(corpus, "arks", use_vad=False), corpus["batches"], use_vad=True)


def test_a_shard_store_serves_one_list_at_a_time(corpus):
    """Two datasets over one store each get their own bound copy: reading one, then the other,
    then the first again never drops the shards the first needs, and each gives its own batches."""
    store = open_store(corpus, "shards")
    fwd = dataset(corpus, "shards", store=store)
    rev = dataset(corpus, "shards", store=store, batches=corpus["batches"][::-1])
    alone = dataset(corpus, "shards", batches=corpus["batches"][::-1])
    assert fwd.store is not rev.store and store.reads is None
    for k in range(len(fwd)):
        assert torch.equal(fwd[k][0], reference(corpus, "shards", k))
        assert torch.equal(rev[k][0], alone[k][0])
    assert fwd.store.reads.reads == len({s for need in fwd.store.reads.needs for s in need})  # each shard once
