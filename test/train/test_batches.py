"""Unit tests of spkflow.train.batches: the spk2utt reader and its errors, the plan on a skewed
corpus (coverage, epochs differ, mixing), crop lengths, batch-list files, and the sampler
inside a real torch DataLoader with a dataset keyed by utterance id."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from spkflow.core.errors import InputError
from spkflow.train.batches import (
    NxMBatchSampler,
    crop_frames,
    num_batches,
    plan_epoch,
    rank_share,
    read_batch_list,
    write_batch_list,
)
from spkflow.train.spk2utt import Spk2Utt, load_spk2utt


def skewed_mapping(num_speakers: int, mean: float, sigma: float, seed: int, min_utts: int = 1) -> dict[str, list[str]]:
    rng = np.random.default_rng(seed)
    counts = np.maximum(min_utts, rng.lognormal(np.log(mean), sigma, num_speakers).astype(int))
    return {f"spk{i:04d}": [f"spk{i:04d}-utt{j:04d}" for j in range(n)] for i, n in enumerate(counts)}


def write_spk2utt(path: Path, mapping: dict[str, list[str]], order: list[str] | None = None) -> Path:
    order = sorted(mapping) if order is None else order
    path.write_text("".join(f"{s} {' '.join(mapping[s])}\n" for s in order), encoding="utf-8")
    return path


def speakers_of(plan) -> np.ndarray:
    """[B, N] speaker indices of a plan's batches."""
    return np.searchsorted(plan.table.offsets, plan.indices[:, :: plan.num_utt], side="right") - 1


# ------------------------------------------------------------------ reader and errors


def test_reader_matches_mapping_and_ignores_line_order(tmp_path: Path) -> None:
    mapping = skewed_mapping(40, 12, 0.8, seed=3)
    rng = np.random.default_rng(0)
    shuffled = list(rng.permutation(sorted(mapping)))
    a = load_spk2utt(write_spk2utt(tmp_path / "sorted", mapping))
    b = load_spk2utt(write_spk2utt(tmp_path / "shuffled", mapping, shuffled))
    assert a.speakers == sorted(mapping) == b.speakers
    assert a.utts == b.utts == [u for s in sorted(mapping) for u in mapping[s]]
    assert b.lines is not None and b.lines[0] == shuffled.index(sorted(mapping)[0]) + 1
    pa = plan_epoch(a, 8, 3, seed=5, epoch=2)
    pb = plan_epoch(b, 8, 3, seed=5, epoch=2)
    assert pa.batches == pb.batches


def test_reader_tolerates_tabs_double_spaces_crlf(tmp_path: Path) -> None:
    p = tmp_path / "spk2utt"
    p.write_bytes(b"b  b1\tb2 \r\na a1 a2\n")
    t = load_spk2utt(p)
    assert t.speakers == ["a", "b"]
    assert t.utts == ["a1", "a2", "b1", "b2"]
    assert t.lines == [2, 1]


@pytest.mark.parametrize(
    "text, line, needle",
    [
        ("", None, "empty"),
        ("\n", None, "empty"),
        ("a a1 a2\n\nb b1\n", 2, "empty line"),
        ("a a1 a2\nb\n", 2, "speaker 'b' has no utterances"),
        ("a a1 a2\nb b1\na a3\n", 3, "speaker 'a' is also on line 1"),
        ("a a1 a2\nb b1 a2\n", 2, "'a2' of speaker 'b' is also listed under speaker 'a'"),
        ("b b1 a2\na a1 a2\n", 2, "'a2' of speaker 'a' is also listed under speaker 'b'"),
        ("a a1 a1\n", 1, "listed twice for speaker 'a'"),
    ],
)
def test_reader_errors_name_file_and_line(tmp_path: Path, text: str, line: int | None, needle: str) -> None:
    p = tmp_path / "spk2utt"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(InputError) as e:
        load_spk2utt(p)
    assert e.value.path == str(p)
    assert e.value.line == line
    assert needle in str(e.value)
    assert str(e.value).startswith(f"{p}:{line}:" if line else f"{p}:")


def test_reader_rejects_non_utf8_with_line(tmp_path: Path) -> None:
    p = tmp_path / "spk2utt"
    p.write_bytes(b"a a1 a2\nb b\xff1\n")
    with pytest.raises(InputError, match=r":2: not UTF-8"):
        load_spk2utt(p)


def test_mapping_errors() -> None:
    with pytest.raises(InputError, match="empty"):
        Spk2Utt.from_mapping({})
    with pytest.raises(InputError, match="no utterances"):
        Spk2Utt.from_mapping({"a": []})
    with pytest.raises(InputError, match="also listed under speaker 'a'"):
        Spk2Utt.from_mapping({"a": ["x"], "b": ["x"]})


def test_parameter_and_feasibility_errors(tmp_path: Path) -> None:
    mapping = {"a": ["a1", "a2", "a3"], "b": ["b1", "b2", "b3"], "c": ["c1"]}
    p = write_spk2utt(tmp_path / "spk2utt", mapping)
    for bad in (
        {"num_spk": 0},
        {"num_utt": 0},
        {"world_size": 0},
        {"rank": 2, "world_size": 2},
        {"short_speakers": "keep"},
        {"seed": -1},
        {"epoch": -1},
    ):
        kw = {"num_spk": 2, "num_utt": 3, "seed": 0, "epoch": 1} | bad
        with pytest.raises(ValueError):
            plan_epoch(p, **kw)
    with pytest.raises(InputError, match=r"--num-spk 3 is more than the 2 speakers with at least 3") as e:
        plan_epoch(p, 3, 3, seed=0, epoch=1)
    assert e.value.path == str(p)
    # with "repeat" the short speaker counts, so 3 speakers fit
    plan = plan_epoch(p, 3, 3, seed=0, epoch=1, short_speakers="repeat")
    assert len(plan) == 1 and plan.stats.repeated_speakers == 1
    with pytest.raises(InputError, match="fewer than the 2 ranks"):
        plan_epoch(p, 2, 3, seed=0, epoch=1, world_size=2, rank=0)


# ------------------------------------------------------------------ the plan


def test_coverage_on_skewed_corpus_and_epochs_differ() -> None:
    mapping = skewed_mapping(600, 60, 0.7, seed=1, min_utts=3)
    table = Spk2Utt.from_mapping(mapping)
    N, M = 32, 6
    plans = [plan_epoch(table, N, M, seed=7, epoch=e) for e in (1, 2)]
    possible = sum(len(u) // M for u in mapping.values())
    for p in plans:
        assert p.stats.groups_possible == possible
        assert p.stats.coverage >= 0.995
        assert p.stats.coverage == p.stats.groups_used / possible
        assert p.stats.utts_used == len(p) * N * M == len(set(np.ravel(p.indices)))
        assert p.stats.dropped_speakers == sum(len(u) < M for u in mapping.values())
    # different epochs: different utterance groups and different speaker combinations
    groups = [{frozenset(row[k * M : (k + 1) * M]) for row in p.batches for k in range(N)} for p in plans]
    assert len(groups[0] & groups[1]) < 0.05 * len(groups[0])
    combos = [{frozenset(r) for r in speakers_of(p).tolist()} for p in plans]
    assert not combos[0] & combos[1]
    # a different seed changes the plan too; the same arguments do not
    assert plan_epoch(table, N, M, seed=8, epoch=1).batches != plans[0].batches
    assert plan_epoch(table, N, M, seed=7, epoch=1).batches == plans[0].batches


def test_batches_are_mixed_like_random_assignment() -> None:
    """Speaker pairs met in one epoch: as many distinct pairs as a random assignment of the
    same groups gives (a plain wrap-around without per-row permutations meets the same
    few neighbours over and over and falls far below)."""
    mapping = skewed_mapping(400, 40, 0.6, seed=2, min_utts=5)
    N, M = 16, 5
    plan = plan_epoch(mapping, N, M, seed=0, epoch=1)
    spk = speakers_of(plan)
    B = spk.shape[0]

    def distinct_pair_ratio(rows: np.ndarray) -> float:
        pairs = Counter()
        for row in rows.tolist():
            row = sorted(row)
            pairs.update((row[i], row[j]) for i in range(len(row)) for j in range(i + 1, len(row)))
        return len(pairs) / sum(pairs.values())

    ours = distinct_pair_ratio(spk)
    rng = np.random.default_rng(0)
    counts = Counter(spk.ravel().tolist())
    pool = np.array([s for s, c in counts.items() for _ in range(c)])
    baseline = distinct_pair_ratio(rng.permutation(pool).reshape(B, N))
    assert ours >= 0.95 * baseline
    # every speaker's batches are spread over the epoch, not bunched
    first_half = np.isin(np.arange(B), np.arange(B // 2))
    heavy = [s for s, c in counts.items() if c >= 20]
    for s in heavy:
        rows = np.flatnonzero((spk == s).any(axis=1))
        share = first_half[rows].mean()
        assert 0.15 < share < 0.85


def test_repeat_fills_short_speakers_from_their_own_utterances() -> None:
    mapping = {f"s{i}": [f"s{i}-{j}" for j in range(n)] for i, n in enumerate([1, 2, 5, 9, 12, 4, 3])}
    plan = plan_epoch(mapping, 3, 4, seed=1, epoch=1, short_speakers="repeat")
    owner = {u: s for s, us in mapping.items() for u in us}
    seen_short = Counter()
    for b in plan.batches:
        for k in range(3):
            block = b[k * 4 : (k + 1) * 4]
            (s,) = {owner[u] for u in block}
            if len(mapping[s]) < 4:
                assert set(block) == set(mapping[s])
                seen_short[s] += 1
    assert all(c == 1 for c in seen_short.values())
    assert plan.stats.repeated_speakers == 3  # the speakers with 1, 2 and 3 utterances
    dropped = plan_epoch(mapping, 3, 4, seed=1, epoch=1)
    assert dropped.stats.dropped_speakers == 3
    assert all(len(mapping[owner[u]]) >= 4 for b in dropped.batches for u in b)


def test_rank_share_of_a_batch_list_file_matches_the_rank_plans(tmp_path: Path) -> None:
    mapping = skewed_mapping(45, 18, 0.9, seed=9)
    out = tmp_path / "epoch2.txt"
    write_batch_list(out, plan_epoch(mapping, 5, 3, seed=2, epoch=2))
    single = read_batch_list(out)
    for r in range(4):
        assert rank_share(single, 4, r) == plan_epoch(mapping, 5, 3, seed=2, epoch=2, world_size=4, rank=r).batches
    with pytest.raises(ValueError):
        rank_share(single, 4, 4)


def test_num_batches_is_epoch_independent() -> None:
    mapping = skewed_mapping(50, 20, 1.0, seed=4)
    n = num_batches(mapping, 8, 4, world_size=4)
    assert all(
        len(plan_epoch(mapping, 8, 4, seed=s, epoch=e, world_size=4, rank=3)) == n for s in (0, 1) for e in (1, 2, 3)
    )


# ------------------------------------------------------------------ crop lengths


def test_crop_frames_pure_varied_and_bounded() -> None:
    values = [crop_frames(3, 2, i, 140, 180) for i in range(2000)]
    assert values == [crop_frames(3, 2, i, 140, 180) for i in range(2000)]
    assert min(values) == 140 and max(values) == 180
    counts = np.bincount(np.array(values) - 140, minlength=41)
    assert counts.min() > 20  # every length drawn, roughly uniform
    assert values != [crop_frames(3, 3, i, 140, 180) for i in range(2000)]
    assert values != [crop_frames(4, 2, i, 140, 180) for i in range(2000)]
    assert crop_frames(0, 1, 5, 160, 160) == 160
    for bad in ((0, 1, 0, 0, 10), (0, 1, 0, 20, 10), (-1, 1, 0, 1, 2), (0, 1, -3, 1, 2)):
        with pytest.raises(ValueError):
            crop_frames(*bad)


# ------------------------------------------------------------------ batch-list files


def test_write_and_read_batch_list(tmp_path: Path) -> None:
    mapping = skewed_mapping(30, 15, 0.5, seed=5)
    plan = plan_epoch(mapping, 4, 3, seed=0, epoch=1)
    out = tmp_path / "b" / "epoch1.txt"
    write_batch_list(out, plan)
    assert read_batch_list(out) == plan.batches
    assert read_batch_list(out, batch_size=12) == plan.batches
    assert not [p for p in out.parent.iterdir() if p.name != "epoch1.txt"]  # no temp file left
    bad = tmp_path / "bad.txt"
    bad.write_text("a b c\nd e\n")
    with pytest.raises(InputError, match=r"bad.txt:2: 2 utterance ids, expected 3"):
        read_batch_list(bad)
    bad.write_text("a b c\n\nd e f\n")
    with pytest.raises(InputError, match=r"bad.txt:2: empty line"):
        read_batch_list(bad)


# ------------------------------------------------------------------ sampler in a DataLoader


class UttDataset:
    """A map-style dataset keyed by utterance id (what spkflow's loaders do)."""

    def __init__(self, mapping: dict[str, list[str]]) -> None:
        self.owner = {u: s for s, us in mapping.items() for u in us}

    def __getitem__(self, utt: str) -> tuple[str, str]:
        return utt, self.owner[utt]

    def __len__(self) -> int:
        return len(self.owner)


def test_sampler_in_torch_dataloader_resumes(tmp_path: Path) -> None:
    torch_data = pytest.importorskip("torch.utils.data")
    mapping = skewed_mapping(40, 20, 0.6, seed=6, min_utts=4)
    spk2utt = write_spk2utt(tmp_path / "spk2utt", mapping)
    sampler = NxMBatchSampler(str(spk2utt), num_spk=6, num_utt=4, seed=11, world_size=2, rank=1)
    loader = torch_data.DataLoader(UttDataset(mapping), batch_sampler=sampler, collate_fn=list)
    assert len(loader) == len(sampler) == num_batches(mapping, 6, 4, world_size=2)

    sampler.set_epoch(3)
    epoch3 = [[utt for utt, _ in batch] for batch in loader]
    assert epoch3 == plan_epoch(mapping, 6, 4, seed=11, epoch=3, world_size=2, rank=1).batches
    for batch in loader:  # every batch: 6 speakers x 4 utterances, speaker-major
        speakers = [spk for _, spk in batch]
        assert len(set(speakers)) == 6 and all(len(set(speakers[k * 4 : (k + 1) * 4])) == 1 for k in range(6))
        break

    # stop after 5 steps, checkpoint, resume in a fresh sampler and loader
    sampler.set_epoch(4)
    done = []
    for step, batch in enumerate(loader):
        done.append([u for u, _ in batch])
        if step == 4:
            break
    state = sampler.state_dict(position=5)
    assert state["epoch"] == 4 and state["position"] == 5 and state["seed"] == 11

    fresh = NxMBatchSampler(load_spk2utt(spk2utt), num_spk=6, num_utt=4, world_size=2, rank=1)
    fresh.load_state_dict(state)
    fresh.set_epoch(4)
    rest = [[u for u, _ in b] for b in torch_data.DataLoader(UttDataset(mapping), batch_sampler=fresh, collate_fn=list)]
    full = plan_epoch(mapping, 6, 4, seed=11, epoch=4, world_size=2, rank=1).batches
    assert done + rest == full
    assert fresh.state_dict()["position"] == len(full)
    # the next epoch starts at 0
    fresh.set_epoch(5)
    assert next(iter(fresh)) == plan_epoch(mapping, 6, 4, seed=11, epoch=5, world_size=2, rank=1).batches[0]
    # indices instead of ids
    idx = NxMBatchSampler(mapping, 6, 4, seed=11, epoch=5, world_size=2, rank=1, yield_indices=True)
    first = next(iter(idx))
    assert [idx.table.utts[i] for i in first] == fresh.plan.batches[0]
    assert fresh.crop_frames(0, 140, 180) == crop_frames(11, 5, 0, 140, 180)


def test_sampler_state_checks_settings() -> None:
    mapping = skewed_mapping(20, 10, 0.3, seed=8, min_utts=3)
    a = NxMBatchSampler(mapping, 4, 3, seed=1)
    b = NxMBatchSampler(mapping, 5, 3, seed=1)
    with pytest.raises(ValueError, match="num_spk"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="position"):
        a.load_state_dict(a.state_dict() | {"position": len(a) + 1})
    with pytest.raises(ValueError):
        a.state_dict(position=-1)
