"""The N x M crop loader (spkflow.train.loader) on real kaldiio arks, in real DataLoader workers."""

from __future__ import annotations

from pathlib import Path

import kaldiio
import numpy as np
import pytest
import torch

from helpers.audio import make_speakers
from helpers.cudart import FakeCudart, FakeEvents
from spkflow.core.errors import InputError
from spkflow.core.shared_batches import InSlot, PageLocks
from spkflow.data.ark import KaldiArkReader
from spkflow.features.fbank import FbankOptions, VadOptions, apply_frontend
from spkflow.features.jobs import _cmvn_stats, extract_job, merge_jobs, write_split
from spkflow.train.batches import crop_frames
from spkflow.train.loader import NxMCropDataset, make_loader

F = 6


def frame_ids(utt_index: int, rows: int) -> np.ndarray:
    """Features whose values say where they come from: [t, f] = 1000 * utt + t + f / 100."""
    t = np.arange(rows, dtype=np.float32)[:, None]
    return (1000.0 * utt_index + t + np.arange(F, dtype=np.float32)[None, :] / 100).astype(np.float32)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> dict:
    """12 utterances (4 speakers x 3) of known lengths (two shorter than the crop), VAD with
    gaps, per-utterance stats, written as Kaldi arks by kaldiio."""
    d = tmp_path_factory.mktemp("synth")
    rng = np.random.default_rng(0)
    lengths = [300, 250, 40, 180, 400, 220, 90, 310, 200, 260, 500, 170]  # 40 and 90 < T
    utts = [f"spk{i // 3}-u{i % 3}" for i in range(12)]
    feats, vads = {}, {}
    for i, (u, n) in enumerate(zip(utts, lengths, strict=True)):
        feats[u] = frame_ids(i, n)
        v = (rng.random(n) < 0.7).astype(np.float32)
        v[:5] = 0.0
        vads[u] = v
    vads[utts[5]][:] = 0.0  # nothing voiced: the frontend keeps every frame
    with kaldiio.WriteHelper(f"ark,scp:{d}/feats.ark,{d}/feats.scp") as w:
        for u in utts:
            w(u, feats[u])
    with kaldiio.WriteHelper(f"ark,scp:{d}/vad.ark,{d}/vad.scp") as w:
        for u in utts:
            w(u, vads[u])
    with kaldiio.WriteHelper(f"ark,scp:{d}/cv.ark,{d}/cmvn_utt_voiced.scp") as w:
        for u in utts:
            w(u, _cmvn_stats(feats[u], vads[u]))
    with kaldiio.WriteHelper(f"ark,scp:{d}/c.ark,{d}/cmvn_utt.scp") as w:
        for u in utts:
            w(u, _cmvn_stats(feats[u], None))
    batches = [utts[i:] + utts[:i] for i in range(0, 12, 2)] * 2  # 12 batches of 12 (N=4 x M=3 sized)
    return {"dir": d, "utts": utts, "feats": feats, "vad": vads, "batches": batches}


def ds(s: dict, **kw) -> NxMCropDataset:
    kw.setdefault("crop", (100, 140))
    return NxMCropDataset(s["dir"] / "feats.scp", s["batches"], **kw)


def test_shape_dtype_and_crop_length(synthetic):
    d = ds(synthetic, seed=3, epoch=1)
    for b in range(len(d)):
        x, utts = d[b]
        T = crop_frames(3, 1, b, 100, 140)
        assert x.dtype == torch.float32 and x.shape == (12, T, F)
        assert utts == synthetic["batches"][b]
    x, _ = ds(synthetic, crop=160)[0]
    assert x.shape == (12, 160, F)


def test_crops_are_consecutive_frames_or_wrapped(synthetic):
    d = ds(synthetic, use_vad=False, mean_norm="none", crop=120)
    for b in range(4):
        x, utts = d[b]
        for row, u in zip(x.numpy(), utts, strict=True):
            full = synthetic["feats"][u]
            t = (row[:, 0] % 1000).astype(int)  # frame indices the crop came from
            assert np.array_equal(row, full[t])
            if len(full) >= 120:
                assert np.array_equal(np.diff(t), np.ones(119))
            else:  # wrapped: a rotation of the whole utterance, repeated
                assert np.array_equal(t, (t[0] + np.arange(120)) % len(full))
                assert set(t) == set(range(len(full)))


def test_voiced_frames_only(synthetic):
    d = ds(synthetic, use_vad=True, mean_norm="none", crop=100)
    seen_wrapped = False
    for b in range(len(d)):
        x, utts = d[b]
        for row, u in zip(x.numpy(), utts, strict=True):
            vad = synthetic["vad"][u]
            voiced = np.flatnonzero(vad > 0.5) if vad.any() else np.arange(len(vad))
            t = (row[:, 0] % 1000).astype(int)
            pos = np.searchsorted(voiced, t)
            assert np.array_equal(voiced[pos], t)  # every frame is voiced
            if len(voiced) >= 100:
                assert np.array_equal(np.diff(pos), np.ones(99))  # consecutive among the voiced
            else:
                seen_wrapped = True
                assert np.array_equal(pos, (pos[0] + np.arange(100)) % len(voiced))
    assert seen_wrapped


def test_utterance_mean_matches_frontend(synthetic, tmp_path):
    for use_vad in (True, False):
        d = ds(synthetic, use_vad=use_vad, mean_norm="utterance", crop=100)
        raw = ds(synthetic, use_vad=use_vad, mean_norm="none", crop=100)
        x, utts = d[2]
        y, _ = raw[2]
        for i, u in enumerate(utts):
            ref = apply_frontend(synthetic["feats"][u], synthetic["vad"][u], use_vad=use_vad, mean_norm=False)
            assert np.allclose(y[i].numpy() - x[i].numpy(), ref.mean(0), atol=1e-3)
    # without the stats files the loader computes the same means from the whole utterances
    for name in ("feats.ark", "feats.scp", "vad.ark", "vad.scp"):
        (tmp_path / name).write_bytes((synthetic["dir"] / name).read_bytes())
    (tmp_path / "feats.scp").write_text(
        (synthetic["dir"] / "feats.scp").read_text().replace(str(synthetic["dir"]), str(tmp_path))
    )
    (tmp_path / "vad.scp").write_text(
        (synthetic["dir"] / "vad.scp").read_text().replace(str(synthetic["dir"]), str(tmp_path))
    )
    a = NxMCropDataset(tmp_path / "feats.scp", synthetic["batches"], crop=100)
    assert a.store.cmvn is None
    assert torch.allclose(a[4][0], ds(synthetic, crop=100)[4][0], atol=1e-3)


def test_stats_of_a_batch_as_each_utterance_reads_them(synthetic, tmp_path):
    """A batch's statistics in one gather (plain_stack): each found one equals its plain_view, an
    entry of another shape or a missing one is not found; the means agree with mean() one by one,
    which also serves the utterances a statistics file lacks."""
    utts = synthetic["utts"]
    r = KaldiArkReader(synthetic["dir"] / "cmvn_utt.scp")
    stats, found = r.plain_stack([*utts[::-1], "nobody"], "DM", 2, F + 1)
    assert found.tolist() == [True] * len(utts) + [False]
    for u, s in zip(utts[::-1], stats, strict=False):
        assert np.array_equal(s, r.plain_view(u, "DM", 2, F + 1))
    assert not r.plain_stack(utts, "DM", 2, F)[1].any() and not r.plain_stack(utts, "DV", 2)[1].any()
    lines = (synthetic["dir"] / "cmvn_utt.scp").read_text().splitlines()
    (tmp_path / "feats.scp").write_text((synthetic["dir"] / "feats.scp").read_text())
    (tmp_path / "cmvn_utt.scp").write_text("\n".join(lines[1::2]) + "\n")  # half the utterances
    store = ds(synthetic, use_vad=False, cmvn_scp=tmp_path / "cmvn_utt.scp").store
    rows = [store.frames(u)[0] for u in utts]
    means = store.means_of(utts, [None] * len(utts), rows, F)
    for j, u in enumerate(utts):
        assert np.array_equal(means[j], store.mean(u, None, rows[j], F))
        assert np.allclose(means[j], synthetic["feats"][u].mean(axis=0), atol=1e-4)


def test_crop_mean_norm(synthetic):
    x, _ = ds(synthetic, mean_norm="crop")[1]
    assert torch.allclose(x.mean(dim=1), torch.zeros(12, F), atol=1e-3)


@pytest.mark.parametrize("access", ["pread", "mmap"])
def test_deterministic_and_resumable_across_workers(synthetic, access):
    d = ds(synthetic, seed=5, epoch=2, access=access)
    full = list(make_loader(d, num_workers=2, prefetch_factor=2))
    assert len(full) == len(d)
    again = [d[b] for b in range(len(d))]  # in process
    resumed = list(make_loader(d, start_batch=7, num_workers=1))
    for (x, u), (y, v) in zip(full, again, strict=True):
        assert u == v and torch.equal(x, y)
    for (x, u), (y, v) in zip(full[7:], resumed, strict=True):
        assert u == v and torch.equal(x, y)
    assert len(resumed) == len(d) - 7
    other_epoch = ds(synthetic, seed=5, epoch=3)
    assert not torch.equal(other_epoch[0][0][:, :100], full[0][0][:, :100])
    other_seed = ds(synthetic, seed=6, epoch=2)
    assert not torch.equal(other_seed[0][0][:, :100], full[0][0][:, :100])
    assert list(make_loader(d, start_batch=len(d), num_workers=0)) == []
    with pytest.raises(ValueError):
        make_loader(d, start_batch=len(d) + 1)


def test_recycled_buffers_never_overwrite_a_kept_batch(synthetic):
    """Workers fill recycled shared-memory buffers; a batch the caller keeps (the tensor, a view
    of it or a numpy array of it) is never reused, the others are, and every batch equals the
    in-process one."""
    d = ds(synthetic, seed=3, epoch=1, crop=(60, 120))
    ref = [d[b][0].clone() for b in range(len(d))]
    for _epoch in range(2):
        loader = make_loader(d, num_workers=2, prefetch_factor=2)
        kept: dict[int, object] = {}
        ptrs = set()
        for b, (x, _) in enumerate(loader):
            assert torch.equal(x, ref[b])
            ptrs.add(x.untyped_storage().data_ptr())
            if b % 3 == 0:
                kept[b] = x
            elif b % 3 == 1:
                kept[b] = x[1:].numpy()  # a view, through numpy
            del x
        for b, k in kept.items():
            got = k if isinstance(k, torch.Tensor) else torch.from_numpy(k)
            want = ref[b] if isinstance(k, torch.Tensor) else ref[b][1:]
            assert torch.equal(got, want), f"batch {b} was overwritten"
        assert len(ptrs) < len(d)  # the dropped batches' buffers did come back
    plain = list(make_loader(d, num_workers=2, prefetch_factor=2, reuse_buffers=False))
    assert all(torch.equal(x, r) for (x, _), r in zip(plain, ref, strict=True))


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_batches_travel_in_slots_the_workers_were_given_at_start(synthetic, context):
    """The pool's first buffers (slots) reach the workers once, when they start (inherited, or
    pickled with the dataset under spawn); the batches made in them come back as views of the
    main process's own slots, equal to the in-process batches, again under persistent workers."""
    d = ds(synthetic, seed=4, epoch=1)
    ref = [d[b][0].clone() for b in range(len(d))]
    loader = make_loader(d, num_workers=1, prefetch_factor=2, multiprocessing_context=context, persistent_workers=True)
    for _epoch in range(2):
        in_slots = 0
        for b, (x, _) in enumerate(loader):
            assert torch.equal(x, ref[b])
            ptr = x.untyped_storage().data_ptr()
            in_slots += any(ptr == t.untyped_storage().data_ptr() for t in loader._slots)
            del x
        assert in_slots == len(d)  # each batch dropped at once: every one fits a free slot
    assert len(loader._slots) == 1 * 2 + 2
    # what a worker sends for a batch made in slot 0: its number and place, not the tensor (under
    # spawn the main process would map a returned tensor to its own slot again, unseen above)
    sent, utts = loader.dataset[(0, 0)]
    assert isinstance(sent, InSlot) and sent.slot == 0 and utts == d.batches[0]


def test_a_gpus_loader_page_locks_its_slots_and_holds_each_batch_till_the_device_is_past_it(synthetic, monkeypatch):
    """With ``pin_memory`` on a CUDA machine the slots are page-locked once per epoch, before the
    first batch, instead of torch pinning a copy of each batch; a batch is held until the device
    is past the point its caller asked for the next one (the copy from its slot), however far the
    caller runs ahead; the slots are released, the device synchronised first, when the epoch ends.
    CUDA (its presence, runtime and events) is stood in for: no GPU here; the workers and arks are real."""
    import spkflow.train.loader as loader_module

    made: list[tuple[FakeCudart, FakeEvents]] = []

    def fake_locks(device: str) -> PageLocks:
        cudart, events = FakeCudart(), FakeEvents()
        made.append((cudart, events))
        sync = lambda: cudart.calls.append(("sync",))  # noqa: E731
        return PageLocks(device, cudart=cudart, synchronize=sync, event=events, background=False)  # checkable order

    monkeypatch.setattr(loader_module, "PageLocks", fake_locks)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    d = ds(synthetic, seed=5, epoch=1)
    ref = [d[b][0].clone() for b in range(len(d))]
    loader = make_loader(d, num_workers=2, prefetch_factor=2, pin_memory=True)
    assert loader.pooled and not loader.pin_memory and len(made) == 1  # no pinned copies where there are slots
    cudart, events = made[0]
    for epoch in range(2):
        seen = []
        for b, (x, _) in enumerate(loader):
            ptrs = [t.untyped_storage().data_ptr() for t in loader._slots]
            assert [c[1] for c in cudart.calls[epoch * (2 * len(ptrs) + 1) :]] == ptrs  # before the first batch
            assert torch.equal(x, ref[b])
            seen.append(x.untyped_storage().data_ptr())
            del x
        assert len(events.made) == (epoch + 1) * len(d) and len(set(seen)) == len(d)  # none done: none came round
        epoch_calls = cudart.calls[epoch * (2 * len(ptrs) + 1) :]
        assert epoch_calls[len(ptrs) :] == [("sync",)] + [("unregister", p) for p in ptrs]
        assert not loader.page_locks.held


def test_bad_inputs(synthetic, tmp_path):
    with pytest.raises(InputError, match=r"feats\.scp: utterance 'nobody' of batch 1 \(line 2 of the batch list\)"):
        NxMCropDataset(synthetic["dir"] / "feats.scp", [synthetic["utts"], ["nobody"] * 12], crop=10)
    (tmp_path / "feats.scp").write_text((synthetic["dir"] / "feats.scp").read_text())  # no vad.scp beside it
    with pytest.raises(InputError, match="use_vad needs a vad.scp"):
        NxMCropDataset(tmp_path / "feats.scp", synthetic["batches"], crop=10)
    assert len(NxMCropDataset(tmp_path / "feats.scp", synthetic["batches"], crop=10, use_vad=False)) == 12
    with pytest.raises(ValueError, match="mean_norm"):
        ds(synthetic, mean_norm="global")
    with pytest.raises(ValueError, match="crop"):
        ds(synthetic, crop=(50, 20))
    (tmp_path / "dup.scp").write_text("a x.ark:1\na x.ark:2\n")
    with pytest.raises(InputError, match="dup.scp:2: duplicate key 'a'"):
        KaldiArkReader(tmp_path / "dup.scp")
    # a truncated ark is an error naming the entry, never a crash or garbage
    ark = (synthetic["dir"] / "feats.ark").read_bytes()
    (tmp_path / "t.ark").write_bytes(ark[:2000])
    (tmp_path / "t.scp").write_text(
        f"spk0-u0 {tmp_path / 't.ark'}:{(synthetic['dir'] / 'feats.scp').read_text().split()[1].rsplit(':', 1)[1]}\n"
    )
    for access in ("mmap", "pread"):
        with pytest.raises(OSError, match="'spk0-u0' is truncated"):
            KaldiArkReader(tmp_path / "t.scp", access=access).read("spk0-u0")
        with pytest.raises(OSError, match="'spk0-u0' is truncated"):
            KaldiArkReader(tmp_path / "t.scp", access=access).gather(
                "spk0-u0", np.arange(100, 120), np.empty((20, F), np.float32), contiguous=True
            )
        with pytest.raises(OSError, match="'spk0-u0' is truncated"):
            KaldiArkReader(tmp_path / "t.scp", access=access).spans_into(
                ["spk0-u0"], [100], np.empty((1, 20, F), np.float32)
            )
    with pytest.raises(KeyError, match="not in"):
        KaldiArkReader(synthetic["dir"] / "feats.scp").read("nobody")


@pytest.mark.parametrize("access", ["mmap", "pread"])
@pytest.mark.parametrize("method", [None, 1, 2, 3, 5])
def test_reader_matches_kaldiio(tmp_path, method, access):
    """Uncompressed float/double and every Kaldi compression type, rows slices and vectors."""
    rng = np.random.default_rng(1)
    mats = {f"u{i}": (rng.standard_normal((n, 80)) * 3 + 5).astype(np.float32) for i, n in enumerate((5, 57, 300))}
    mats["u9"] = mats["u2"].astype(np.float64) if method is None else mats["u2"]
    with open(tmp_path / "m.ark", "wb") as f, open(tmp_path / "m.scp", "w") as s:
        for k, v in mats.items():
            kaldiio.save_ark(f, {k: v}, scp=s, compression_method=method)
    (tmp_path / "v.scp").write_text("")
    kaldiio.save_ark(str(tmp_path / "v.ark"), {"v": np.arange(7, dtype=np.float32)}, scp=str(tmp_path / "v.scp"))
    ref = kaldiio.load_scp(str(tmp_path / "m.scp"))
    r = KaldiArkReader(tmp_path / "m.scp", access=access)
    for k in mats:
        want = np.asarray(ref[k], dtype=np.float32)
        assert np.allclose(r.read(k), want, rtol=1e-5, atol=1e-5)
        assert np.allclose(r.read_rows(k, 2, 5), want[2:5], rtol=1e-5, atol=1e-5)
        out = np.empty((3, 80), np.float32)
        r.gather(k, np.array([4, 0, 2]), out)
        assert np.allclose(out, want[[4, 0, 2]], rtol=1e-5, atol=1e-5)
        r.gather(k, np.array([1, 2, 3]), out, contiguous=True)
        assert np.allclose(out, want[1:4], rtol=1e-5, atol=1e-5)
    # a batch of crops at once: the same values as the gather of each (uncompressed floats: one
    # read or copy per crop; the others through gather), whatever the order of the entries
    keys = list(mats) * 2
    starts = [1, 40, 200, 7, 2, 0, 297, 150]  # u0 u1 u2 u9, twice
    crops = np.empty((len(keys), 3, 80), np.float32)
    r.spans_into(keys, starts, crops)
    for j, (k, lo) in enumerate(zip(keys, starts, strict=True)):
        r.gather(k, np.arange(lo, lo + 3), out, contiguous=True)
        assert np.array_equal(crops[j], out)
    with pytest.raises(IndexError, match=r"rows 4:7 of 'u0' \(5 rows\)"):
        r.spans_into(["u1", "u0"], [0, 4], crops[:2])
    with pytest.raises(ValueError, match="'u1' has dimension 80, expected 40"):
        r.spans_into(["u1"], [0], np.empty((1, 3, 40), np.float32))
    assert np.array_equal(KaldiArkReader(tmp_path / "v.scp").read("v"), np.arange(7, dtype=np.float32))


def test_one_byte_code_table_is_kaldis_formula_for_every_code():
    """The CM decode looks bytes up in a per-column table; each of the 256 codes (the pieces meet
    at 64 and 192) decodes to Kaldi's ``Uint8ToFloat`` evaluated on that value alone, bit for bit."""
    from spkflow.data.ark import _cm_decode

    rng = np.random.default_rng(3)
    pc = np.sort(rng.standard_normal((7, 4)).astype(np.float32) * 4, axis=1)
    q = np.ascontiguousarray(np.tile(np.arange(256, dtype=np.uint8), (7, 1)))[:, ::-1].T  # [256, 7], strided
    got = _cm_decode(q, pc)
    for r, c in np.ndindex(*q.shape):
        p0, p25, p75, p100 = pc[c]
        v = np.float32(q[r, c])
        if v <= 64:
            want = p0 + (p25 - p0) * v * np.float32(1 / 64.0)
        elif v <= 192:
            want = p25 + (p75 - p25) * (v - np.float32(64.0)) * np.float32(1 / 128.0)
        else:
            want = p75 + (p100 - p75) * (v - np.float32(192.0)) * np.float32(1 / 63.0)
        assert got[r, c] == want, (r, c, int(q[r, c]))


@pytest.mark.parametrize("method", [None, 2, 3, 5])
def test_select_rows_keeps_each_rows_bytes(tmp_path, method):
    """A record cut to some rows (the voiced-frame shards) is the same format, and kaldiio decodes
    it to exactly those rows of the whole matrix: float, double, and Kaldi's one-byte-per-column
    (kSpeechFeature), two-byte and one-byte codes, no second quantisation."""
    import io

    from spkflow.data.ark import select_rows

    rng = np.random.default_rng(2)
    m = (rng.standard_normal((57, 24)) * 3 + 5).astype(np.float32)
    mats = {"f": m} if method else {"f": m, "d": m.astype(np.float64)}
    keep = np.flatnonzero(rng.random(57) < 0.6)
    for k, v in mats.items():
        kaldiio.save_ark(str(tmp_path / f"{k}.ark"), {k: v}, scp=str(tmp_path / f"{k}.scp"), compression_method=method)
        rec = KaldiArkReader(tmp_path / f"{k}.scp").record_bytes(k)
        (_, whole), *_ = kaldiio.load_ark(io.BytesIO(b"u " + rec))
        cut = select_rows(rec, keep)
        (_, got), *_ = kaldiio.load_ark(io.BytesIO(b"u " + cut))
        assert cut[: cut.index(b" ") + 1] == rec[: rec.index(b" ") + 1] and len(cut) < len(rec)
        assert got.dtype == whole.dtype and np.array_equal(got, whole[keep])
        assert select_rows(rec, np.arange(57)) == rec  # every row: the record itself
    with pytest.raises(ValueError, match="increasing"):
        select_rows(rec, np.array([3, 1]))
    with pytest.raises(ValueError, match="matrix record"):
        select_rows(b"not a record", keep)


def test_compressed_features_through_make_fbank_jobs(tmp_path):
    """--compress true arks (Kaldi CM2 two-byte by default, CM with method 1) feed the loader;
    values within the compression error."""
    data = make_speakers(tmp_path, num_spk=2, num_utt=3)
    for compress, method, name in ((False, 3, "raw"), (True, 3, "cm2"), (True, 1, "cm")):
        split = write_split(data, tmp_path / name / "split", 1)
        extract_job(
            data,
            split[0],
            tmp_path / name / "data",
            "t",
            1,
            FbankOptions(),
            VadOptions(),
            compress=compress,
            compression_method=method,
            progress=False,
        )
        merge_jobs(data, tmp_path / name, tmp_path / name / "data", "t", 1)
    kinds = {
        name: open(next((tmp_path / name / "data").glob("raw_fbank_t.1.ark")), "rb").read(64)
        for name in ("raw", "cm2", "cm")
    }
    assert b"\0BFM " in kinds["raw"] and b"\0BCM2 " in kinds["cm2"] and b"\0BCM " in kinds["cm"]
    utts = list(kaldiio.load_scp(str(tmp_path / "raw" / "feats.scp")))
    batches = [utts] * 3
    raw = NxMCropDataset(tmp_path / "raw" / "feats.scp", batches, crop=60)
    for name, max_err, mean_err in (("cm2", 1e-3, 1e-4), ("cm", 0.5, 0.05)):
        for access in ("pread", "mmap"):
            cmp = NxMCropDataset(tmp_path / name / "feats.scp", batches, crop=60, access=access)
            for i in range(3):
                xa, xb = raw[i][0], cmp[i][0]
                assert xa.shape == xb.shape
                assert (xa - xb).abs().max() < max_err and (xa - xb).abs().mean() < mean_err, name


def test_real_features_frontend_consistency(tmp_path):
    """On fbank from real extraction: a crop of the loader is a window of apply_frontend's
    output (voiced frames, utterance mean removed)."""
    data = make_speakers(tmp_path, num_spk=2, num_utt=2, min_sec=1.5, max_sec=2.0)
    split = write_split(data, tmp_path / "split", 1)
    extract_job(data, split[0], tmp_path / "arks", "t", 1, FbankOptions(), VadOptions(), progress=False)
    merge_jobs(data, tmp_path, tmp_path / "arks", "t", 1)
    feats = kaldiio.load_scp(str(tmp_path / "feats.scp"))
    vad = kaldiio.load_scp(str(tmp_path / "vad.scp"))
    utts = list(feats)
    x, got = NxMCropDataset(Path(tmp_path) / "feats.scp", [utts], crop=80, seed=9)[0]
    for row, u in zip(x.numpy(), got, strict=True):
        front = apply_frontend(feats[u], vad[u], use_vad=True, mean_norm=True)
        start = int(np.argmin(np.abs(front - row[0]).sum(1)))
        assert np.allclose(front[start : start + 80], row, atol=1e-4)
