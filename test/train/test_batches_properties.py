"""Property tests (hypothesis) of the N x M epoch planner: guarantees a-g of spkflow.train.batches.

Random spk2utt shapes: skewed, tiny speakers, huge speakers, N close to the number of
speakers, 1, 2 and 4 ranks.  Each property is checked against quantities the test
computes on its own (the packing bound by a linear scan, utterance ownership from the
input mapping), not against the planner's own bookkeeping.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from spkflow.core.errors import InputError
from spkflow.train.batches import NxMBatchSampler, crop_frames, plan_epoch
from spkflow.train.spk2utt import Spk2Utt

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def spk2utt_shapes(draw) -> dict[str, list[str]]:
    """{speaker: [utterance ids]} with a mix of tiny, ordinary and huge speakers."""
    num_spk = draw(st.integers(1, 30))
    kinds = st.sampled_from(["tiny", "ordinary", "ordinary", "huge"])
    counts = []
    for _ in range(num_spk):
        kind = draw(kinds)
        lo, hi = {"tiny": (1, 3), "ordinary": (1, 25), "huge": (40, 250)}[kind]
        counts.append(draw(st.integers(lo, hi)))
    # ids that do not sort like their numbers, and speaker names of varied length
    stems = draw(st.lists(st.text("abcxyzAZ09_-", max_size=4), min_size=num_spk, max_size=num_spk))
    names = [f"{stem}{i}" for i, stem in enumerate(stems)]
    return {
        name: [f"{name}#u{j * 7919 % 1000:03d}.{j}" for j in range(n)] for name, n in zip(names, counts, strict=True)
    }


def packing_bound(mapping: dict[str, list[str]], num_spk: int, num_utt: int, repeat: bool) -> int:
    """Largest B with sum_s min(groups_s, B) >= N * B, by a plain scan (a speaker can be in
    a batch once, so no plan can have more batches)."""
    groups = [len(u) // num_utt or (1 if repeat else 0) for u in mapping.values()]
    best = 0
    for b in range(1, sum(groups) // num_spk + 1):
        if sum(min(g, b) for g in groups) >= num_spk * b:
            best = b
    return best


def owner_map(mapping: dict[str, list[str]]) -> dict[str, str]:
    return {u: s for s, us in mapping.items() for u in us}


def check_batches(
    batches: list[list[str]], mapping: dict[str, list[str]], num_spk: int, num_utt: int, repeat: bool
) -> None:
    """Guarantees a and b over the batches of all ranks of one epoch."""
    owner = owner_map(mapping)
    short = {s for s, us in mapping.items() if len(us) < num_utt}
    used: set[str] = set()
    short_seen: set[str] = set()
    for b in batches:
        assert len(b) == num_spk * num_utt
        speakers = []
        for k in range(num_spk):
            block = b[k * num_utt : (k + 1) * num_utt]
            spk = {owner[u] for u in block}
            assert len(spk) == 1, f"block {k} mixes speakers {spk}"
            (s,) = spk
            speakers.append(s)
            if s in short:
                assert repeat, "a short speaker entered under 'drop'"
                assert set(block) == set(mapping[s]), "a repeated speaker must use all of its utterances"
                assert s not in short_seen, "a repeated speaker entered twice in one epoch"
                short_seen.add(s)
            else:
                assert len(set(block)) == num_utt, "utterances of a speaker repeat within a batch"
                assert not used & set(block), "an utterance is used twice in one epoch"
                used |= set(block)
        assert len(set(speakers)) == num_spk, "a speaker is twice in one batch"


@SETTINGS
@given(mapping=spk2utt_shapes(), data=st.data())
def test_plan_guarantees_a_to_e(mapping: dict[str, list[str]], data) -> None:
    num_speakers = len(mapping)
    num_spk = data.draw(st.integers(1, num_speakers + 1), label="N")
    num_utt = data.draw(st.integers(1, 6), label="M")
    world = data.draw(st.sampled_from([1, 2, 4]), label="W")
    repeat = data.draw(st.booleans(), label="repeat")
    seed = data.draw(st.integers(0, 2**40), label="seed")
    epoch = data.draw(st.integers(0, 5), label="epoch")
    policy = "repeat" if repeat else "drop"

    bound = packing_bound(mapping, num_spk, num_utt, repeat)
    if bound // world == 0:
        event("too few speakers or batches: InputError")
        with pytest.raises(InputError):
            plan_epoch(mapping, num_spk, num_utt, seed, epoch, world, 0, policy)
        return

    event(f"planned, {'capped' if bound < sum(len(u) // num_utt for u in mapping.values()) // num_spk else 'uncapped'}")
    plans = [plan_epoch(mapping, num_spk, num_utt, seed, epoch, world, r, policy) for r in range(world)]
    # e: same number of batches on every rank
    per_rank = bound // world
    assert [len(p) for p in plans] == [per_rank] * world
    # a, b over the union of the ranks (so ranks are disjoint too)
    every = [b for p in plans for b in p.batches]
    check_batches(every, mapping, num_spk, num_utt, repeat)
    # c: the packing reaches the bound; the stats say what happened
    stats = plans[0].stats
    assert stats.batches_global == bound
    assert stats.groups_used == per_rank * world * num_spk
    assert stats.remainder_batches_dropped == bound - per_rank * world
    groups_possible = sum(len(u) // num_utt or (1 if repeat else 0) for u in mapping.values())
    assert stats.groups_possible == groups_possible
    n_short = sum(len(u) < num_utt for u in mapping.values())
    assert (stats.repeated_speakers if repeat else stats.dropped_speakers) == n_short
    if bound == groups_possible // num_spk:
        # no speaker was capped: fewer than N groups left over before the rank split
        assert groups_possible - bound * num_spk < num_spk
    # e: rank r's batches are lines r::W of the single-rank plan, cut to equal length
    single = plan_epoch(mapping, num_spk, num_utt, seed, epoch, 1, 0, policy).batches
    for r, p in enumerate(plans):
        assert p.batches == single[r : per_rank * world : world]
    # d: pure function of the inputs, whatever the order of the speakers
    shuffled = dict(sorted(mapping.items(), key=lambda kv: kv[0][::-1]))
    again = plan_epoch(shuffled, num_spk, num_utt, seed, epoch, world, world - 1, policy)
    assert again.batches == plans[-1].batches


@SETTINGS
@given(mapping=spk2utt_shapes(), data=st.data())
def test_sampler_resume_guarantee_f(mapping: dict[str, list[str]], data) -> None:
    num_spk = data.draw(st.integers(1, len(mapping)), label="N")
    num_utt = data.draw(st.integers(1, 4), label="M")
    world = data.draw(st.sampled_from([1, 4]), label="W")
    assume(packing_bound(mapping, num_spk, num_utt, False) // world > 0)
    rank = data.draw(st.integers(0, world - 1), label="rank")
    seed = data.draw(st.integers(0, 1000), label="seed")
    epoch = data.draw(st.integers(1, 4), label="epoch")
    table = Spk2Utt.from_mapping(mapping)

    full = NxMBatchSampler(table, num_spk, num_utt, seed=seed, world_size=world, rank=rank)
    full.set_epoch(epoch)
    reference = list(full)
    assert len(reference) == len(full)
    assert reference == plan_epoch(table, num_spk, num_utt, seed, epoch, world, rank).batches

    k = data.draw(st.integers(0, len(reference)), label="k")
    first = NxMBatchSampler(table, num_spk, num_utt, seed=seed, world_size=world, rank=rank)
    first.set_epoch(epoch)
    it = iter(first)
    consumed = [next(it) for _ in range(k)]
    assert consumed == reference[:k]
    state = first.state_dict()
    assert (state["seed"], state["epoch"], state["position"]) == (seed, epoch, k)

    resumed = NxMBatchSampler(table, num_spk, num_utt, seed=0, epoch=1, world_size=world, rank=rank)
    resumed.load_state_dict(dict(state))
    resumed.set_epoch(epoch)  # the usual loop calls set_epoch(saved epoch): keeps the position
    rest = list(resumed)
    if k == len(reference):
        assert rest == reference  # a finished epoch iterated again starts over
    else:
        assert rest == reference[k:]


@settings(max_examples=200, deadline=None)
@given(
    seed=st.integers(0, 2**63),
    epoch=st.integers(0, 10**6),
    index=st.integers(0, 10**7),
    lo=st.integers(1, 400),
    width=st.integers(0, 200),
)
def test_crop_frames_guarantee_g(seed: int, epoch: int, index: int, lo: int, width: int) -> None:
    n = crop_frames(seed, epoch, index, lo, lo + width)
    assert isinstance(n, int) and lo <= n <= lo + width
    assert crop_frames(seed, epoch, index, lo, lo + width) == n
