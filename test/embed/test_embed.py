"""Unit tests of stage 5 (spkflow.embed.run, spkflow.embed.base, spkflow.data.jobs): batch planning, job
outputs and resume bookkeeping, merge checks and speaker means, scp alignment, padding invariance of the spkflow path.

Everything runs in process on small synthetic audio and a tiny real spkflow model (random
weights, BatchNorm statistics made non-trivial so that padding would show)."""

from __future__ import annotations

import itertools
import os
import re
from pathlib import Path

import kaldiio
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.audio import make_mixed_data, make_speakers
from helpers.cudart import FakeCudart, FakeEvents
from helpers.models import l2, make_spkflow_model_dir
from helpers.spread import permuted, within
from spkflow.core.errors import InputError, UtteranceError
from spkflow.embed.base import (
    PadCollate,
    pad,
    pad_into,
    padded_shape,
    plan_batches,
    planned_frames,
    split_by_frames,
)
from spkflow.embed.run import (
    JobWriter,
    MergeError,
    align_scp,
    committed_entries,
    merge_embeddings,
    read_commit_log,
    run_job,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_spkflow_model_dir(tmp_path_factory.mktemp("model") / "spk_tiny")


@pytest.fixture(scope="module")
def embedder(model_dir: Path):
    from spkflow.embed.native import SpkflowEmbedder

    return SpkflowEmbedder(model_dir)


# ----------------------------------------------------------------------------- batches


@settings(max_examples=60, deadline=None)
@given(
    durs=st.lists(st.one_of(st.none(), st.floats(0.05, 30.0)), min_size=0, max_size=60),
    batch_size=st.integers(1, 9),
    max_frames=st.integers(20, 4000),
)
def test_plan_batches_covers_once_and_respects_bounds(durs, batch_size, max_frames):
    utts = [f"u{i:03d}" for i in range(len(durs))]
    durations = dict(zip(utts, durs, strict=True))
    batches = plan_batches(utts, durations, batch_size, max_frames)
    flat = [u for b in batches for u in b]
    assert sorted(flat) == utts  # every utterance exactly once
    assert all(1 <= len(b) <= batch_size for b in batches)
    for b in batches:
        known = [durations[u] for u in b if durations[u] is not None]
        if len(known) == len(b) and len(b) > 1:
            longest = max(int(np.ceil(d * 100)) for d in known)
            assert len(b) * max(1, longest) <= max_frames
    # longest first among known durations; unknown ones at the end
    order = [durations[u] for u in flat]
    known_part = [d for d in order if d is not None]
    assert known_part == sorted(known_part, reverse=True)
    if None in order:
        assert all(d is None for d in order[order.index(None) :])
    assert plan_batches(utts, durations, batch_size, max_frames) == batches  # deterministic


@settings(max_examples=60, deadline=None)
@given(lens=st.lists(st.integers(1, 500), min_size=1, max_size=40), max_frames=st.integers(1, 2000))
def test_split_by_frames_bound(lens, max_frames):
    parts = split_by_frames(list(enumerate(lens)), lambda it: it[1], max_frames)
    assert sorted(i for p in parts for i, _ in p) == list(range(len(lens)))
    for p in parts:
        assert len(p) == 1 or len(p) * max(n for _, n in p) <= max_frames


def test_pad_into_zeroes_the_padding_of_a_reused_buffer():
    xs = [np.ones((3, 2), np.float32), 2 * np.ones((5, 2), np.float32)]
    out = np.full(padded_shape(xs), np.nan, dtype=np.float32)  # a buffer holding an old batch
    assert pad_into(xs, out).tolist() == [3, 5]
    assert (out[0, :3] == 1).all() and (out[0, 3:] == 0).all() and (out[1] == 2).all()
    fresh, lengths = pad(xs)
    assert np.array_equal(fresh, out) and lengths.tolist() == [3, 5]


def test_pad_collate_makes_the_batch_in_shared_memory_in_a_worker():
    """In a DataLoader worker the padded batch is made in shared memory (handed over uncopied);
    in the main process (no workers) in ordinary memory; the same values either way."""
    import torch
    from torch.utils.data import DataLoader

    rng = np.random.default_rng(0)
    items = [(f"u{i}", rng.standard_normal((n, 4)).astype(np.float32), None) for i, n in enumerate((7, 3, 5))]
    collate = PadCollate(lambda x: x.shape[0], max_frames=10**6)

    def where(batch: list) -> tuple:  # what the worker's collate made, seen where it was made
        _, parts = collate(batch)
        return parts, [feats.is_shared() for _, feats, _ in parts]

    seen = {}
    for workers in (0, 1):
        loader = DataLoader(items, batch_size=3, collate_fn=where, num_workers=workers)
        ((parts, shared),) = list(loader)
        seen[workers] = shared
        ((utts, feats, lengths),) = parts
        assert sorted(utts) == ["u0", "u1", "u2"]
        for i, u in enumerate(utts):
            x = dict((k, v) for k, v, _ in items)[u]
            assert lengths[i] == len(x) and torch.equal(feats[i, : len(x)], torch.from_numpy(x))
            assert not feats[i, len(x) :].any()
    assert seen == {0: [False], 1: [True]}


@pytest.mark.parametrize("keep", [False, True])
def test_stage5_batches_come_back_in_recycled_buffers(embedder, tmp_path, keep):
    """With workers, stage 5's padded batches come back in the job pool's slots (buffers the
    workers got at start, sized from the plan's bound on a batch) and equal the batches made
    without workers; a caller that keeps every batch never sees one overwritten, and a lone
    utterance longer than the bound comes back in a buffer of its own, the slots kept."""
    from spkflow.embed.loader import job_loader

    data = make_speakers(tmp_path, num_spk=4, num_utt=8, min_sec=0.5, max_sec=1.5, seed=3)
    utts = sorted((data / "utt2spk").read_text().split()[::2])

    def batches(workers: int, max_frames: int) -> tuple[list, list[bool], object]:
        loader, worker_side = job_loader(embedder, data, utts, batch_size=2, max_frames=max_frames, num_workers=workers)
        assert worker_side
        out, in_slot = [], []
        for _, parts in loader:
            slots = {t.untyped_storage().data_ptr() for t in getattr(loader, "slots", [])}
            in_slot.append(parts[0][1].untyped_storage().data_ptr() in slots)
            out.append([(keys, f if keep else f.clone(), n) for keys, f, n in parts])
        return out, in_slot, loader

    for max_frames in (400, 110):  # every batch within the bound; the utterances over 1.1 s alone
        plain, _, _ = batches(0, max_frames)
        pooled, in_slot, loader = batches(2, max_frames)
        assert len(pooled) == len(plain) and len(plain) >= 16
        for a, b in zip(pooled, plain, strict=True):
            for (ka, fa, na), (kb, fb, nb) in zip(a, b, strict=True):
                assert ka == kb and torch.equal(fa, fb) and torch.equal(na, nb)
        assert loader.pool.enabled and len(loader.pool.slots) == len(loader.slots) == 10  # 2 x 4 + 2
        size = loader.slots[0].numel()
        over = [sum(f.numel() for _, f, _ in parts) > size for parts in plain]
        assert any(over) == (max_frames == 110) and not any(o and s for o, s in zip(over, in_slot, strict=True))
        fitting = sum(1 for o in over if not o)
        # kept batches hold their slots: the next ones come in buffers of their own
        assert sum(in_slot) == (fitting if not keep else 10), (in_slot, over)


def test_planned_frames_is_the_largest_batch_and_unknown_without_every_duration():
    durs = {"a": 1.0, "b": 0.5, "c": 0.31, "d": None}
    plan = plan_batches(["a", "b", "c"], durs, 2, 10**6)
    assert plan == [["a", "b"], ["c"]] and planned_frames(plan, durs) == 200
    assert planned_frames(plan_batches(list(durs), durs, 2, 10**6), durs) is None


def test_stage5_slots_are_as_large_as_the_largest_batch_planned_not_the_bound(embedder, tmp_path):
    """A generous ``max_frames`` (a GPU's) does not make every slot that large: they hold the
    largest planned batch, and every batch still comes back in one."""
    from spkflow.data.durations import known_durations
    from spkflow.embed.loader import job_loader

    data = make_speakers(tmp_path, num_spk=2, num_utt=6, min_sec=0.5, max_sec=1.5, seed=4)
    utts = sorted((data / "utt2spk").read_text().split()[::2])
    loader, _ = job_loader(embedder, data, utts, batch_size=3, max_frames=10**6, num_workers=2)
    collate = embedder.collater(10**6)
    largest = planned_frames(plan_batches(utts, known_durations(data, utts), 3, 10**6), known_durations(data, utts))
    assert loader.slots[0].numel() == collate.elements(largest) < collate.bound // 100
    slots = {t.untyped_storage().data_ptr() for t in loader.slots}
    assert all(parts[0][1].untyped_storage().data_ptr() in slots for _, parts in loader)


def test_launched_embeddings_equal_embed_padded(embedder):
    feats, lengths = torch.randn(4, 300, embedder.fbank.num_mel_bins), torch.tensor([300, 250, 200, 120])
    pending = embedder.launch_padded(feats, lengths)
    vecs = pending.result()
    assert vecs.shape == (4, embedder.dim) and vecs.dtype == np.float32
    assert np.array_equal(vecs, embedder.embed_padded(feats, lengths))


def test_page_locked_slots_are_locked_before_the_first_batch_and_released_after_the_last(embedder, tmp_path):
    """Stage 5's loader on CUDA page-locks its slots while the workers make the first batches and
    releases them, the device synchronised first, when the loop ends, also when it is left early
    (CUDA's runtime stood in for: there is no GPU here; the loader and its workers are real).
    Registered in the foreground, "before the first batch" is checked; in the background (the
    job's way), whatever was registered by the loop's end, a prefix of the slots, and only that,
    is released."""
    from spkflow.core.shared_batches import PageLocks
    from spkflow.embed.loader import job_loader

    data = make_speakers(tmp_path, num_spk=2, num_utt=6, min_sec=0.5, max_sec=1.0, seed=5)
    utts = sorted((data / "utt2spk").read_text().split()[::2])
    for background, leave_after in itertools.product((False, True), (None, 1)):
        cudart = FakeCudart()
        loader, _ = job_loader(embedder, data, utts, batch_size=2, max_frames=400, num_workers=2)
        loader.locks = PageLocks(
            "cuda:0",
            cudart=cudart,
            synchronize=lambda c=cudart: c.calls.append(("sync",)),
            event=FakeEvents(),
            background=background,
        )
        ptrs = [t.untyped_storage().data_ptr() for t in loader.slots]
        sizes = [t.untyped_storage().nbytes() for t in loader.slots]
        seen = 0
        for _ in loader:
            if not background:
                assert cudart.calls == [("register", p, n, 0) for p, n in zip(ptrs, sizes, strict=True)]
            seen += 1
            if seen == leave_after:
                break
        assert seen == (leave_after or len(loader))
        k = sum(1 for c in cudart.calls if c[0] == "register")
        assert k == len(ptrs) or background
        assert cudart.calls == [("register", p, n, 0) for p, n in zip(ptrs[:k], sizes[:k], strict=True)] + (
            [("sync",)] + [("unregister", p) for p in ptrs[:k]] if k else []
        )


# ----------------------------------------------------------------------------- job outputs


def test_commit_log_ignores_torn_tail_and_lost_ark(tmp_path):
    rng = np.random.default_rng(0)
    vecs = {f"a-{i}": rng.standard_normal(8).astype(np.float32) for i in range(5)}
    with JobWriter(tmp_path, 1) as w:
        w.write(list(vecs.items())[:3])
        w.write(list(vecs.items())[3:])
    log_path = tmp_path / "xvector.1.scp"
    lines = log_path.read_text().splitlines()
    assert len(lines) == 5
    # a kill while appending: the last line is incomplete
    with open(log_path, "a") as f:
        f.write("a-9 " + str(tmp_path / "xvector.1.1.ark"))
    # a commit whose ark disappeared
    (tmp_path / "xvector.7.scp").write_text(f"b-1 {tmp_path}/xvector.7.1.ark:12\n")
    got = dict(read_commit_log(log_path))
    assert list(got) == list(vecs)
    entries = committed_entries(tmp_path)
    assert set(entries) == set(vecs)
    for k, spec in entries.items():
        np.testing.assert_array_equal(kaldiio.load_mat(spec), vecs[k])
    # a second attempt of the same job appends to the log but writes a new ark
    with JobWriter(tmp_path, 1) as w2:
        assert w2.attempt == 2 and w2.ark_path.endswith("xvector.1.2.ark")
        w2.write([("a-9", vecs["a-0"])])
    assert set(committed_entries(tmp_path)) == set(vecs) | {"a-9"}


def _data_dir(root: Path, spk2utt: dict[str, list[str]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    pairs = sorted((u, s) for s, us in spk2utt.items() for u in us)
    (root / "utt2spk").write_text("".join(f"{u} {s}\n" for u, s in pairs))
    (root / "spk2utt").write_text("".join(f"{s} {' '.join(sorted(us))}\n" for s, us in sorted(spk2utt.items())))
    (root / "wav.scp").write_text("".join(f"{u} /nonexistent/{u}.wav\n" for u, _ in pairs))
    return root


def test_merge_lists_missing_and_extra_keys_and_writes_nothing(tmp_path):
    data = _data_dir(tmp_path / "data", {"a": ["a-1", "a-2", "a-3"], "b": ["b-1", "b-2"]})
    rng = np.random.default_rng(1)
    with JobWriter(tmp_path / "jobs", 1) as w:
        w.write([(u, rng.standard_normal(4)) for u in ("a-1", "a-3", "b-2", "c-9")])
    with pytest.raises(MergeError) as err:
        merge_embeddings(data, tmp_path / "jobs", tmp_path / "out")
    msg = str(err.value)
    assert "2 utterance(s) without an embedding: a-2 b-1" in msg
    assert "1 embedding(s) of utterances not in the data dir: c-9" in msg
    assert not (tmp_path / "out" / "xvector.scp").exists()


def test_merge_order_means_and_bad_speakers(tmp_path):
    spk2utt = {"b": ["b-1", "b-2", "b-3"], "a": ["a-1", "a-2"], "c": ["c-1"]}
    data = _data_dir(tmp_path / "data", spk2utt)
    rng = np.random.default_rng(2)
    vecs = {
        u: (rng.standard_normal(6) * rng.uniform(0.5, 5)).astype(np.float32) for u in ("b-3", "a-2", "b-1", "a-1")
    }  # completion order, not data-dir order
    jobs = tmp_path / "jobs"
    with JobWriter(jobs, 2) as w:
        w.write(list(vecs.items())[:2])
    with JobWriter(jobs, 1) as w:
        w.write(list(vecs.items())[2:])
    (jobs / "bad_utts.1").write_text("b-2 /x/b-2.wav: audio file not found\nc-1 /x/c-1.wav: audio file not found\n")
    # without skip_bad the failed utterances are missing: the merge fails and says why
    with pytest.raises(MergeError, match="of which 2 failed"):
        merge_embeddings(data, jobs, tmp_path / "out")
    rep = merge_embeddings(data, jobs, tmp_path / "out", skip_bad=True)
    out = tmp_path / "out"
    assert rep.num_utts == 4 and rep.num_spks == 2 and rep.dim == 6 and rep.empty_spks == ["c"]
    xv = kaldiio.load_scp(str(out / "xvector.scp"))
    assert list(xv) == ["a-1", "a-2", "b-1", "b-3"]  # utt2spk (LC_ALL=C) order
    for u, v in vecs.items():
        assert xv[u].dtype == np.float32
        np.testing.assert_array_equal(xv[u], v)
    sp = kaldiio.load_scp(str(out / "spk_xvector.scp"))
    assert list(sp) == ["a", "b"]  # c has no embedded utterance: reported, not averaged over nothing
    np.testing.assert_allclose(sp["a"], (vecs["a-1"] + vecs["a-2"]) / 2, rtol=1e-6)
    np.testing.assert_allclose(sp["b"], (vecs["b-1"] + vecs["b-3"]) / 2, rtol=1e-6)
    assert (out / "bad_utts").read_text().splitlines() == [
        "b-2 /x/b-2.wav: audio file not found",
        "c-1 /x/c-1.wav: audio file not found",
    ]
    assert (out / "bad_spks").read_text().split()[0] == "c"
    # the ark is readable sequentially in the same order
    assert [k for k, _ in kaldiio.load_ark(str(out / "xvector.ark"))] == list(xv)
    # l2 means weigh every utterance equally
    merge_embeddings(data, jobs, tmp_path / "out_l2", skip_bad=True, spk_mean="l2")
    sp2 = kaldiio.load_scp(str(tmp_path / "out_l2" / "spk_xvector.scp"))
    np.testing.assert_allclose(sp2["b"], (l2(vecs["b-1"]) + l2(vecs["b-3"])) / 2, rtol=1e-5)


def test_merge_refuses_unsorted_data_dir(tmp_path):
    data = _data_dir(tmp_path / "data", {"a": ["a-1", "a-2"]})
    (data / "utt2spk").write_text("a-2 a\na-1 a\n")
    with pytest.raises(InputError, match=r"utt2spk:2: not sorted"):
        merge_embeddings(data, tmp_path / "jobs", tmp_path / "out")


# ----------------------------------------------------------------------------- alignment


def test_align_scp_filters_sorts_and_reports_first_mismatch(tmp_path):
    data = _data_dir(tmp_path / "data", {"a": ["a-1", "a-2"], "b": ["b-1"]})
    scp = tmp_path / "xvector.scp"
    scp.write_text("b-1 x.ark:30\nzz-9 x.ark:40\na-2 x.ark:20\na-1 x.ark:10\n")
    summary = align_scp(data, scp)
    assert scp.read_text() == "a-1 x.ark:10\na-2 x.ark:20\nb-1 x.ark:30\n"
    assert "1 dropped" in summary
    # speaker-level files are aligned with spk2utt
    spk = tmp_path / "spk_xvector.scp"
    spk.write_text("b y.ark:2\na y.ark:1\n")
    align_scp(data, spk)
    assert spk.read_text() == "a y.ark:1\nb y.ark:2\n"
    # a missing key: the first differing line is named and the file is left untouched
    bad = tmp_path / "bad.scp"
    original = "b-1 x.ark:30\na-1 x.ark:10\n"
    bad.write_text(original)
    with pytest.raises(InputError, match=r"line 2 should be 'a-2'.*but is 'b-1'; 1 key\(s\)"):
        align_scp(data, bad)
    assert bad.read_text() == original
    dup = tmp_path / "dup.scp"
    dup.write_text("a-1 x.ark:1\na-1 x.ark:2\n")
    with pytest.raises(InputError, match=r"dup.scp:2: duplicate key"):
        align_scp(data, dup)


# ----------------------------------------------------------------------------- spkflow path


def test_spkflow_batched_equals_alone(embedder, tmp_path):
    """Mixed lengths (0.3 s to 6 s) in one batch: each embedding equals the one alone."""
    data = make_speakers(tmp_path, num_spk=2, num_utt=4, min_sec=0.3, max_sec=6.0, seed=5)
    prep = embedder.preparer(data)
    utts = permuted((data / "utt2spk").read_text().split()[::2])
    xs = [prep(u) for u in utts]
    lens = [x.shape[0] for x in xs]
    assert len(set(lens)) >= len(xs) - 2 and max(lens) > 3 * min(lens)  # mixed lengths, lots of padding
    batched = embedder.embed(xs)
    alone = np.concatenate([embedder.embed([x]) for x in xs])
    # measured <= 5.8e-7 (1 and 2 threads, batch order permuted)
    within("batched vs alone (L2-normalised)", float(np.abs(l2(batched) - l2(alone)).max()), 1e-4)


def test_features_from_a_stage2_dump_equal_features_from_audio(model_dir, embedder, tmp_path):
    """--feats-dir: feats.scp (+ vad.scp) written as stage 2 does give the same model input."""
    from spkflow.data.audio import AudioReader
    from spkflow.embed.native import SpkflowEmbedder
    from spkflow.features.fbank import compute_fbank, compute_vad

    data = make_mixed_data(tmp_path, num_spk=1, num_utt=3)
    dump = tmp_path / "dump"
    dump.mkdir()
    reader = AudioReader(data, sample_rate=16000)
    utts = reader.keys()
    with (
        kaldiio.WriteHelper(f"ark,scp:{dump}/feats.ark,{dump}/feats.scp") as wf,
        kaldiio.WriteHelper(f"ark,scp:{dump}/vad.ark,{dump}/vad.scp") as wv,
    ):
        for u in utts:
            feats = compute_fbank(reader.read(u), 16000, embedder.fbank)
            wf[u] = feats
            wv[u] = compute_vad(feats, embedder.vad)
    from_feats = SpkflowEmbedder(model_dir, feats_dir=dump).preparer(data)
    from_audio = embedder.preparer(data)
    for u in utts:
        np.testing.assert_allclose(from_feats(u), from_audio(u), atol=1e-5)
    with pytest.raises(UtteranceError, match="not in feats.scp"):
        from_feats("s9-u9")


def test_run_job_bad_utterance_then_skip_and_resume(embedder, tmp_path):
    data = make_speakers(tmp_path, num_spk=2, num_utt=3, seed=3)
    victim = "spk001-utt01"
    wav = (data / "wav.scp").read_text().replace(f"{victim} ", f"{victim} /nonexistent/dir/")
    (data / "wav.scp").write_text(wav)
    utts = (data / "utt2spk").read_text().split()[::2]
    jobs = tmp_path / "jobs"
    with pytest.raises(UtteranceError) as err:
        run_job(embedder, data, utts, jobs, 1, batch_size=2, num_workers=0, progress=False)
    assert err.value.utt == victim and "not found" in str(err.value)
    before = set(committed_entries(jobs))
    assert victim not in before
    rep = run_job(embedder, data, utts, jobs, 1, batch_size=2, num_workers=0, skip_bad=True, progress=False)
    assert rep.resumed == len(before) and rep.computed == len(utts) - 1 - len(before)
    assert set(rep.bad) == {victim}
    assert (jobs / "bad_utts.1").read_text().startswith(f"{victim} ")
    assert set(committed_entries(jobs)) == set(utts) - {victim}
    # the second run committed only what the first lacked: one line per utterance in total
    lines = [ln.split()[0] for p in sorted(jobs.glob("xvector.*.scp")) for ln in p.read_text().splitlines()]
    assert sorted(lines) == sorted(set(utts) - {victim})


def test_a_failing_batch_comes_after_every_batch_before_it_is_committed(embedder, tmp_path):
    """The job writes each batch while the device computes the next: when the next one fails,
    the one before is committed first (a resume then computes only from the failing batch on)."""
    from spkflow.data.durations import known_durations

    data = make_speakers(tmp_path, num_spk=3, num_utt=4, min_sec=0.5, max_sec=1.5, seed=7)
    utts = (data / "utt2spk").read_text().split()[::2]
    victim = utts[5]
    (data / "wav.scp").write_text((data / "wav.scp").read_text().replace(f"{victim} ", f"{victim} /nonexistent/"))
    plan = plan_batches(utts, known_durations(data, utts), 2, 60000)
    failing = next(i for i, b in enumerate(plan) if victim in b)
    assert failing == len(plan) - 1 >= 4  # its duration is unknown: it comes last
    for workers in (0, 2):
        jobs = tmp_path / f"jobs{workers}"
        with pytest.raises(UtteranceError, match="nonexistent"):
            run_job(embedder, data, utts, jobs, 1, batch_size=2, num_workers=workers, progress=False)
        assert set(committed_entries(jobs)) == {u for b in plan[:failing] for u in b}


def test_an_embedding_that_is_not_finite_fails_its_utterance_or_is_skipped(model_dir, tmp_path):
    """A model that gives one utterance NaN: the job fails naming it (the batches before it
    committed), or with ``skip_bad`` lists it in ``bad_utts`` with the reason and writes the rest."""
    from spkflow.data.durations import known_durations
    from spkflow.embed.base import PendingEmbeddings
    from spkflow.embed.native import SpkflowEmbedder

    class NaNOnce(SpkflowEmbedder):
        launched = 0

        def launch_padded(self, feats, lengths):
            out = super().launch_padded(feats, lengths).result()
            NaNOnce.launched += 1
            if NaNOnce.launched == 3:  # the third batch's first utterance
                out = out.copy()
                out[0, 5] = np.nan
            return PendingEmbeddings(torch.from_numpy(out))

    data = make_speakers(tmp_path, num_spk=3, num_utt=4, min_sec=0.5, max_sec=1.5, seed=8)
    utts = (data / "utt2spk").read_text().split()[::2]
    plan = plan_batches(utts, known_durations(data, utts), 2, 60000)
    victim = plan[2][0]
    emb = NaNOnce(model_dir)
    with pytest.raises(UtteranceError, match="NaN or infinite") as err:
        run_job(emb, data, utts, tmp_path / "jobs", 1, batch_size=2, num_workers=2, progress=False)
    assert err.value.utt == victim
    assert set(committed_entries(tmp_path / "jobs")) == {u for b in plan[:2] for u in b}
    NaNOnce.launched = 0
    rep = run_job(emb, data, utts, tmp_path / "skip", 1, batch_size=2, num_workers=2, skip_bad=True, progress=False)
    assert rep.bad == {victim: "the model produced NaN or infinite values"}
    assert set(committed_entries(tmp_path / "skip")) == set(utts) - {victim}
    assert (tmp_path / "skip" / "bad_utts.1").read_text() == f"{victim} the model produced NaN or infinite values\n"


def test_model_dir_errors(tmp_path):
    from spkflow.embed import open_embedder

    with pytest.raises(InputError, match="model not found"):
        open_embedder(tmp_path / "nope", "spkflow")
    assert not (tmp_path / "nope").exists()  # a refused model dir is not created
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match=r"empty: no config.yaml: not a model dir"):
        open_embedder(tmp_path / "empty", "spkflow")
    config = "model: {name: ecapa_tdnn}\n"
    (tmp_path / "empty" / "config.yaml").write_text(config)
    with pytest.raises(InputError, match=r"model.pth: not found"):
        open_embedder(tmp_path / "empty", "spkflow")
    with pytest.raises(ValueError, match="toolkit must be one of"):
        open_embedder(tmp_path / "empty", "kaldi")
    # refusals leave the model dir as it was: nothing written into it, the config untouched
    assert sorted(os.listdir(tmp_path / "empty")) == ["config.yaml"]
    assert (tmp_path / "empty" / "config.yaml").read_text() == config


def test_model_files_and_toolkit_detection(tmp_path):
    """Each toolkit's files (what the stamp hashes), told apart by detect_toolkit without building
    a model; ambiguous or foreign dirs are named."""
    from spkflow.embed import detect_toolkit
    from spkflow.embed.base import model_files

    def make(name: str, files: dict[str, str]) -> Path:
        d = tmp_path / name
        d.mkdir()
        for f, text in files.items():
            (d / f).write_text(text)
        return d

    spk = make("spk", {"config.yaml": "model: {name: ecapa_tdnn}\nfrontend: {}\n", "model.pth": ""})
    esp = make("esp", {"config.yaml": "encoder: rawnet3\n", "valid.eer.best.pth": "", "checkpoint.pth": ""})
    sb = make("sb", {"hyperparams.yaml": "n_mels: 80\n", "embedding_model.ckpt": "", "label_encoder.txt": ""})
    ws = make("ws", {"config.yaml": "dataset_args: {}\nmodel: ResNet34\n", "resnet.onnx": ""})
    assert [detect_toolkit(d) for d in (spk, esp, sb, ws)] == ["spkflow", "espnet", "speechbrain", "wespeaker"]
    assert model_files("spkflow", spk) == [spk / "config.yaml", spk / "model.pth"]
    assert model_files("espnet", esp) == [esp / "config.yaml", esp / "valid.eer.best.pth"]
    assert model_files("speechbrain", sb) == [sb / "hyperparams.yaml", sb / "embedding_model.ckpt"]
    assert model_files("wespeaker", ws) == [ws / "config.yaml", ws / "resnet.onnx"]
    assert model_files("wespeaker", ws / "resnet.onnx") == [ws / "resnet.onnx"]
    (ws / "other.onnx").write_text("")
    with pytest.raises(InputError, match=r"several: other.onnx resnet.onnx\); give --model-file"):
        model_files("wespeaker", ws)
    assert model_files("wespeaker", ws, ws / "other.onnx")[-1] == ws / "other.onnx"
    with pytest.raises(InputError, match="--model-file is for --toolkit espnet or wespeaker"):
        model_files("speechbrain", sb, sb / "embedding_model.ckpt")
    with pytest.raises(InputError, match="cannot tell the toolkit"):
        detect_toolkit(make("empty", {}))


def test_a_job_logs_its_waits_for_batches_and_warns_on_a_gpu_kept_waiting(embedder, tmp_path, caplog):
    """Stage 5 says in its log how much of the job it waited for batches (after the first, which
    starts the workers); on a GPU a share above a quarter is a warning naming what to change."""
    import logging

    from spkflow.embed.run import _report_waits

    data = make_speakers(tmp_path, num_spk=2, num_utt=4, seed=5)
    utts = sorted((data / "utt2spk").read_text().split()[::2])
    with caplog.at_level(logging.INFO, logger="spkflow.embed.run"):
        run_job(embedder, data, utts, tmp_path / "jobs", 1, batch_size=2, num_workers=2, progress=False)
    said = [r.getMessage() for r in caplog.records if "waited for batches" in r.getMessage()]
    assert len(said) == 1, caplog.text
    pattern = r"job 1: waited for batches (\d+)% of the time after the first \(first batch [\d.]+ s, [\d.]+ s in all\)"
    m = re.fullmatch(pattern, said[0])
    assert m is not None and 0 <= int(m.group(1)) <= 100, said
    caplog.clear()
    waits = {"first_batch_seconds": 2.0, "data_wait_seconds": 5.0, "data_wait_share": 0.6}
    with caplog.at_level(logging.INFO, logger="spkflow.embed.run"):
        _report_waits(3, waits, "cpu", "workers")  # a CPU job's model shares the cores: no warning
        _report_waits(3, {**waits, "data_wait_share": 0.2}, "cuda:0", "workers")  # under a quarter
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        _report_waits(3, waits, "cuda:0", "workers")
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "60%" in warned[0] and "--num-workers" in warned[0] and "--fbank-on device" in warned[0]
