"""Losses: hand-computed cases, a naive reference loop, gradients, invariances, config errors."""

from __future__ import annotations

import math

import pytest
import torch

from helpers.spread import within
from spkflow.core.checks import ConfigError
from spkflow.nnet.losses import W_MIN, AAMSoftmaxLoss, GE2ELoss, GE2EXSLoss, batch_labels, build_loss

torch.set_num_threads(1)


# ---------------------------------------------------------------- naive reference
def _unit(v: list[float]) -> list[float]:
    n = math.sqrt(sum(x * x for x in v))
    return [x / n for x in v]


def _cos(a: list[float], b: list[float]) -> float:
    a, b = _unit(a), _unit(b)
    return sum(x * y for x, y in zip(a, b, strict=True))


def _mean(vs: list[list[float]]) -> list[float]:
    return [sum(col) / len(vs) for col in zip(*vs, strict=True)]


def naive_scores(emb: list[list[list[float]]], centroids: str, w: float, b: float) -> list[list[list[float]]]:
    """S[j][i][k] with plain loops, straight from the papers' definitions."""
    e = [[_unit(v) for v in spk] for spk in emb]
    n, m = len(e), len(e[0])
    s = [[[0.0] * n for _ in range(m)] for _ in range(n)]
    for j in range(n):
        for i in range(m):
            for k in range(n):
                if centroids == "exclusive":
                    members = [e[k][u] for u in range(m) if not (k == j and u == i)]
                else:  # split: centroid of the other parity
                    members = [e[k][u] for u in range(m) if u % 2 != i % 2]
                s[j][i][k] = w * _cos(e[j][i], _mean(members)) + b
    return s


def naive_loss(emb, kind: str, centroids: str = "exclusive", w: float = 10.0, b: float = -5.0) -> float:
    s = naive_scores(emb, centroids, w, b)
    n, m = len(s), len(s[0])
    sig = lambda x: 1.0 / (1.0 + math.exp(-x))  # noqa: E731
    total = 0.0
    for j in range(n):
        for i in range(m):
            t = s[j][i][j]
            if kind == "softmax":
                total += -t + math.log(sum(math.exp(s[j][i][k]) for k in range(n)))
            elif kind == "contrast":
                total += 1 - sig(t) + max(sig(s[j][i][k]) for k in range(n) if k != j)
            else:  # xs: the target against every non-target of square i
                non = [s[r][i][k] for r in range(n) for k in range(n) if r != k]
                assert len(non) == n * (n - 1)
                total += -t + math.log(math.exp(t) + sum(math.exp(x) for x in non))
    return total / (n * m)


def val(t: torch.Tensor) -> float:
    return float(t.detach())


def make(kind: str, **kw):
    if kind == "xs":
        return GE2EXSLoss(**kw)
    return GE2ELoss(mode=kind, **kw)


# ---------------------------------------------------------------- hand-computed cases
# speaker 0: (1,0), (0,1); speaker 1: (-1,0), (0,-1).
SQUARE = [[[1.0, 0.0], [0.0, 1.0]], [[-1.0, 0.0], [0.0, -1.0]]]


def test_hand_case_exclusive():
    emb = torch.tensor(SQUARE, dtype=torch.float64)
    w = val(GE2ELoss().double().w)  # 10 up to float32 rounding of the stored parameter
    assert w == pytest.approx(10.0, rel=1e-6)
    # own centroid without the utterance is the other utterance: cos 0 -> S = -5;
    # the other speaker's centroid is at 135 degrees: cos -1/sqrt2 -> S = -5 - 10/sqrt2.
    gap = w / math.sqrt(2)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert val(GE2ELoss("softmax").double()(emb)) == pytest.approx(math.log1p(math.exp(-gap)), rel=1e-9)
    assert val(GE2ELoss("contrast").double()(emb)) == pytest.approx(1 - sig(w * 0 - 5) + sig(-5 - gap), rel=1e-9)
    # square i: both speakers' i-th utterances; 2 non-targets, both at -5 - gap
    assert val(GE2EXSLoss().double()(emb)) == pytest.approx(math.log1p(2 * math.exp(-gap)), rel=1e-9)


def test_hand_case_split():
    emb = torch.tensor(SQUARE, dtype=torch.float64)
    # utterance 0 is scored against both speakers' utterance 1: both orthogonal -> S = -5 everywhere
    assert val(GE2ELoss("softmax", centroids="split").double()(emb)) == pytest.approx(math.log(2), rel=1e-12)
    assert val(GE2EXSLoss(centroids="split").double()(emb)) == pytest.approx(math.log(3), rel=1e-12)


@pytest.mark.parametrize("kind", ["softmax", "contrast", "xs"])
@pytest.mark.parametrize("centroids", ["exclusive", "split"])
def test_matches_naive_loop(kind, centroids):
    g = torch.Generator().manual_seed(3)
    emb = torch.randn(3, 4, 5, generator=g, dtype=torch.float64)
    loss = make(kind, init_w=7.0, init_b=-2.0, centroids=centroids).double()
    assert val(loss.w) == pytest.approx(7.0, rel=1e-6)
    expected = naive_loss(emb.tolist(), kind, centroids, w=val(loss.w), b=val(loss.b))
    assert float(loss(emb).detach()) == pytest.approx(expected, rel=1e-10)


def test_xs_follows_reference_procedure():
    """google/speaker-id builds the XS logits by reordering the [N*M, N] speaker-major score
    matrix into M stacked N x N 'diagonal' blocks (block i: utterance i of every speaker),
    taking each block's diagonal as targets and its N(N-1) off-diagonal entries, shared by
    the block's rows, as non-targets; then softmax cross-entropy with the target in column
    0, averaged.  Redo that procedure in numpy on the split-centroid scores and compare."""
    import numpy as np

    n, m = 4, 6
    emb = torch.randn(n, m, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    loss = GE2EXSLoss(centroids="split").double()
    striped = np.array(naive_scores(emb.tolist(), "split", float(loss.w.detach()), float(loss.b.detach())))
    striped = striped.reshape(n * m, n)  # row j*M + i, speaker-major
    order = np.arange(n * m).reshape(n, m).T.reshape(-1)  # blocks of utterance index i
    stacked = striped[order].reshape(m, n, n)
    per_row = []
    for block in stacked:
        non = block[~np.eye(n, dtype=bool)]
        assert non.size == n * (n - 1)
        for j in range(n):
            logits = np.concatenate([[block[j, j]], non])
            per_row.append(-logits[0] + np.log(np.exp(logits - logits.max()).sum()) + logits.max())
    assert val(loss(emb)) == pytest.approx(float(np.mean(per_row)), rel=1e-10)


def test_init_values_and_float32():
    loss = GE2ELoss()
    assert val(loss.w) == pytest.approx(10.0, rel=1e-6)
    assert val(loss.b) == pytest.approx(-5.0)
    emb = torch.randn(4, 3, 8)
    value = loss(emb)
    assert value.dtype == torch.float32 and value.dim() == 0
    assert val(value) == pytest.approx(naive_loss(emb.double().tolist(), "softmax"), rel=1e-4)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_input_is_computed_in_float32(dtype):
    """Under AMP a model may emit half-precision embeddings; the loss upcasts them."""
    emb = torch.randn(4, 3, 8).to(dtype)
    for loss in (GE2ELoss(), GE2ELoss("contrast"), GE2EXSLoss()):
        value = loss(emb)
        assert value.dtype == torch.float32
        assert val(value) == val(loss(emb.float()))  # exact: the same float32 arithmetic on the same values
    aam = AAMSoftmaxLoss(8, num_classes=4)
    assert aam(emb, torch.tensor([0, 1, 2, 3])).dtype == torch.float32


# ---------------------------------------------------------------- gradients
@pytest.mark.parametrize("kind", ["softmax", "contrast", "xs"])
@pytest.mark.parametrize("centroids", ["exclusive", "split"])
def test_gradcheck(kind, centroids):
    g = torch.Generator().manual_seed(1)
    emb = torch.randn(3, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    w_raw = torch.tensor(1.3, dtype=torch.float64, requires_grad=True)
    b = torch.tensor(-0.7, dtype=torch.float64, requires_grad=True)
    loss = make(kind, centroids=centroids).double()

    def f(e, wr, bb):
        return torch.func.functional_call(loss, {"w_raw": wr, "b": bb}, (e,))

    assert torch.autograd.gradcheck(f, (emb, w_raw, b), eps=1e-6, atol=1e-6)


def test_softmax_forms_ignore_bias_contrast_uses_it():
    emb = torch.randn(3, 4, 6, dtype=torch.float64)
    for loss in (GE2ELoss("softmax").double(), GE2EXSLoss().double()):
        loss(emb).backward()
        assert abs(float(loss.b.grad)) < 1e-12
    contrast = GE2ELoss("contrast").double()
    contrast(emb).backward()
    assert abs(float(contrast.b.grad)) > 1e-6


def test_w_stays_positive_under_large_steps():
    """Scores that punish a large scale push w down; softplus keeps it > 0 however hard."""
    # every utterance is closer to the other speaker: targets lose, so dL/dw > 0
    emb = torch.tensor([[[1.0, 0.1], [0.1, 1.0]], [[1.0, 0.12], [0.12, 1.0]]])
    for loss in (GE2ELoss("softmax"), GE2ELoss("contrast"), GE2EXSLoss()):
        opt = torch.optim.SGD(loss.parameters(), lr=1e4)
        start = val(loss.w)
        for _ in range(20):
            opt.zero_grad()
            loss(emb).backward()
            opt.step()
            assert val(loss.w) >= W_MIN > 0 and math.isfinite(val(loss.w))
        assert val(loss.w) < start


# ---------------------------------------------------------------- invariances and relations
@pytest.mark.parametrize("kind", ["softmax", "contrast", "xs"])
@pytest.mark.parametrize("centroids", ["exclusive", "split"])
def test_speaker_order_invariance(kind, centroids):
    emb = torch.randn(5, 4, 6, dtype=torch.float64)
    loss = make(kind, centroids=centroids).double()
    perm = torch.randperm(5, generator=torch.Generator().manual_seed(0))
    assert val(loss(emb[perm])) == pytest.approx(val(loss(emb)), rel=1e-12)


@pytest.mark.parametrize("kind", ["softmax", "contrast"])
def test_utterance_order_invariance_exclusive(kind):
    emb = torch.randn(4, 5, 6, dtype=torch.float64)
    loss = make(kind).double()
    shuffled = torch.stack([spk[torch.randperm(5)] for spk in emb])
    assert val(loss(shuffled)) == pytest.approx(val(loss(emb)), rel=1e-12)


def test_xs_bounds_row_softmax():
    """A row's non-targets are part of its square's, so XS >= GE2E softmax on the same
    scores; the XS minus softmax gap per utterance is log(1 + others/row) exactly."""
    for seed in range(5):
        emb = torch.randn(4, 6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        for centroids in ("exclusive", "split"):
            xs = val(GE2EXSLoss(centroids=centroids).double()(emb))
            sm = val(GE2ELoss("softmax", centroids=centroids).double()(emb))
            assert xs > sm
    # equality is approached when other rows' non-targets vanish: well-separated speakers
    # along orthogonal axes give both losses ~0
    sep = torch.eye(3, dtype=torch.float64).unsqueeze(1).repeat(1, 2, 1) * 5
    assert val(GE2EXSLoss(init_w=50.0).double()(sep)) < 1e-15


def test_xs_shares_non_targets_across_a_square():
    """Changing one utterance of speaker 0 changes the XS loss of every speaker's
    utterance with the same index (they share a square) but no other rows in GE2E."""
    emb = torch.randn(3, 4, 5, dtype=torch.float64, requires_grad=True)
    per = lambda loss: torch.autograd.grad(loss(emb), emb)[0]  # noqa: E731
    g_xs = per(GE2EXSLoss(centroids="split").double())
    assert g_xs.abs().sum() > 0
    # GE2E row softmax: utterance (1, 0)'s loss depends on (0, 0) only through centroids;
    # XS adds the direct square coupling, so the gradients differ.
    g_sm = per(GE2ELoss("softmax", centroids="split").double())
    assert not torch.allclose(g_xs, g_sm)


# ---------------------------------------------------------------- learning sanity
@pytest.mark.parametrize(
    "cfg",
    [
        {"name": "ge2e"},
        {"name": "ge2e", "mode": "contrast"},
        {"name": "ge2e_xs"},
        {"name": "ge2e_xs", "centroids": "split"},
        {"name": "aamsoftmax"},
        {"name": "aamsoftmax_subcenter"},
    ],
)
def test_training_separates_speakers(cfg):
    """Free embeddings trained with each loss get closer to their own speaker."""
    torch.manual_seed(0)
    n, m, d = 6, 4, 16
    emb = torch.nn.Parameter(torch.randn(n, m, d))
    loss = build_loss(cfg, embed_dim=d, num_classes=n)
    opt = torch.optim.Adam([emb, *loss.parameters()], lr=0.05)
    labels = torch.arange(n)

    def margin() -> float:
        e = torch.nn.functional.normalize(emb.detach(), dim=-1).reshape(n * m, d)
        sim = e @ e.T
        same = labels.repeat_interleave(m)
        tgt = same[:, None] == same[None, :]
        off = ~torch.eye(n * m, dtype=torch.bool)
        return float(sim[tgt & off].mean() - sim[~tgt].mean())

    first = last = None
    before = margin()
    for _ in range(60):
        opt.zero_grad()
        value = loss(emb, labels)
        value.backward()
        opt.step()
        first = val(value) if first is None else first
        last = val(value)
    assert last < first
    assert margin() > before + 0.15


# ---------------------------------------------------------------- AAM wrapper
def test_aam_wrapper_matches_espnet_on_flattened_batch():
    torch.manual_seed(0)
    loss = AAMSoftmaxLoss(8, num_classes=10)
    emb = torch.randn(3, 4, 8)
    labels = torch.tensor([7, 2, 5])
    ours = loss(emb, labels)
    ref, acc, _ = loss.inner(emb.reshape(12, 8), labels.repeat_interleave(4))
    assert torch.equal(ours, ref)
    # the same with [N, M] labels and with the flat form
    assert torch.equal(loss(emb, labels[:, None].expand(3, 4)), ref)
    assert torch.equal(loss(emb.reshape(12, 8), labels.repeat_interleave(4)), ref)
    # speaker order: permuting speakers and their labels together changes nothing
    perm = torch.tensor([2, 0, 1])
    # the rows' mean summed in another order: measured 0 (1 and 2 threads); float32 rounding of 12 terms ~1e-7
    within("AAM speakers permuted (relative)", abs(val(loss(emb[perm], labels[perm])) / val(ours) - 1), 1e-6)
    assert loss.needs_labels and not GE2ELoss.needs_labels


def test_aam_errors():
    loss = AAMSoftmaxLoss(8, num_classes=4)
    emb = torch.randn(2, 3, 8)
    with pytest.raises(ValueError, match="needs labels"):
        loss(emb)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        loss(emb, torch.tensor([1, 4]))
    with pytest.raises(ValueError, match="labels must be"):
        loss(emb, torch.tensor([1, 2, 3]))


# ---------------------------------------------------------------- config and shape errors
def test_build_loss_config():
    loss = build_loss({"name": "ge2e", "mode": "contrast", "init_w": 5, "init_b": -1}, embed_dim=8)
    assert isinstance(loss, GE2ELoss) and loss.mode == "contrast"
    assert val(loss.w) == pytest.approx(5.0, rel=1e-6) and val(loss.b) == -1.0
    assert isinstance(build_loss({"name": "ge2e_xs", "centroids": "split"}, 8), GE2EXSLoss)
    sub = build_loss({"name": "aamsoftmax_subcenter", "K": 2}, 8, num_classes=5)
    assert isinstance(sub, AAMSoftmaxLoss) and sub.inner.K == 2
    # every config mistake is a ConfigError naming the config file and the dotted key
    with pytest.raises(ConfigError, match=r"^conf/x\.yaml: unknown key\(s\) loss\.margn; accepted: "):
        build_loss({"name": "aamsoftmax", "margn": 0.2}, 8, num_classes=5, source="conf/x.yaml")
    with pytest.raises(ConfigError, match=r"^config: unknown key\(s\) loss\.mode"):
        build_loss({"name": "ge2e_xs", "mode": "softmax"}, 8)
    with pytest.raises(ConfigError, match=r"^conf/x\.yaml: loss\.name must be aamsoftmax \| .*, got 'triplet'"):
        build_loss({"name": "triplet"}, 8, source="conf/x.yaml")
    with pytest.raises(ConfigError, match=r"^conf/x\.yaml: loss \(ge2e\): GE2E mode must be"):
        build_loss({"name": "ge2e", "mode": "softmx"}, 8, source="conf/x.yaml")
    with pytest.raises(ValueError, match="num_classes"):  # a caller's mistake, not the config's
        build_loss({"name": "aamsoftmax"}, 8)
    with pytest.raises(ConfigError, match=r"^config: loss \(ge2e\): init_w"):
        build_loss({"name": "ge2e", "init_w": 0}, 8)
    with pytest.raises(ConfigError, match=r"^config: loss \(ge2e\): centroids"):
        build_loss({"name": "ge2e", "centroids": "all"}, 8)


def test_shape_errors():
    with pytest.raises(ValueError, match="N=1"):
        GE2ELoss()(torch.randn(1, 4, 3))
    with pytest.raises(ValueError, match="M=1"):
        GE2EXSLoss()(torch.randn(3, 1, 3))
    with pytest.raises(ValueError, match="even"):
        GE2ELoss(centroids="split")(torch.randn(3, 3, 3))
    with pytest.raises(ValueError, match=r"\[N, M, D\]"):
        GE2ELoss()(torch.randn(6, 3))


def test_batch_labels():
    utt2spk = {"a-1": "a", "a-2": "a", "b-1": "b", "b-2": "b", "c-1": "c", "c-2": "c"}
    spk2idx = {"a": 0, "b": 1, "c": 2}
    assert batch_labels(["c-1", "c-2", "a-2", "a-1"], utt2spk, spk2idx, 2).tolist() == [2, 0]
    with pytest.raises(ValueError, match="not speaker-major"):
        batch_labels(["a-1", "b-1", "a-2", "b-2"], utt2spk, spk2idx, 2)
    with pytest.raises(ValueError, match="two blocks"):
        batch_labels(["a-1", "a-2", "a-2", "a-1"], utt2spk, spk2idx, 2)
    with pytest.raises(ValueError, match="multiple"):
        batch_labels(["a-1", "a-2", "b-1"], utt2spk, spk2idx, 2)
    with pytest.raises(ValueError, match="'zz'"):
        batch_labels(["zz", "a-1"], utt2spk, spk2idx, 2)


def test_margin_warmup_schedule_and_config_errors():
    """margin_at is 0 before the ramp, linear inside it, final after; the loss applies it (the
    logits change) and both AAM variants accept it; bad keys are ConfigErrors naming the key."""
    from espnet2.spk.loss.aamsoftmax import AAMSoftmax

    from spkflow.core.checks import ConfigError
    from spkflow.nnet.losses import build_loss, margin_at

    # 10 steps per epoch, ramp over epochs 2..4 = steps 10..30
    assert [margin_at(s, 10, 0.2, 2, 4) for s in (0, 10, 15, 20, 30, 99)] == pytest.approx(
        [0.0, 0.0, 0.05, 0.1, 0.2, 0.2]
    )
    # WeSpeaker's exponential ramp: final x (1 - 0.001 ** p), fast first, 0.2 from the end on
    exp = [margin_at(s, 10, 0.2, 2, 4, "exp") for s in (10, 15, 20, 29, 30)]
    assert exp == pytest.approx([0.0, 0.2 * (1 - 0.001**0.25), 0.2 * (1 - 0.001**0.5), 0.2 * (1 - 0.001**0.95), 0.2])
    assert exp[2] > margin_at(20, 10, 0.2, 2, 4)  # above the linear ramp half-way
    cfg = {"name": "aamsoftmax", "margin": 0.2, "scale": 30, "margin_warmup": {"start_epoch": 1, "end_epoch": 3}}
    loss = build_loss(cfg, 8, num_classes=4)
    torch.manual_seed(0)
    emb, labels = torch.randn(6, 8), torch.tensor([0, 1, 2, 3, 0, 1])
    loss.schedule(10, 10)  # half-way
    assert loss.scalars()["margin"] == pytest.approx(0.1)
    ref = AAMSoftmax(8, 4, margin=0.1, scale=30)
    ref.load_state_dict(loss.inner.state_dict())
    torch.testing.assert_close(loss(emb, labels), ref(emb, labels)[0])
    sub = build_loss({**cfg, "name": "aamsoftmax_subcenter"}, 8, num_classes=4)
    sub.schedule(0, 10)
    assert sub.inner.margin == 0.0 and sub.scalars()["margin"] == 0.0
    for bad, msg in [
        ({"start_epoch": 1}, "end_epoch must be an integer"),
        ({"start_epoch": 3, "end_epoch": 3}, "must be after start_epoch"),
        ({"start_epoch": 0, "end_epoch": 3}, "start_epoch must be an integer epoch >= 1"),
        ({"start_epoch": 1, "end_epoch": 3, "start_step": 1}, "unknown key.*loss.margin_warmup.start_step"),
        ([1, 3], "margin_warmup must be a mapping"),
        ({"start_epoch": 1, "end_epoch": 3, "shape": "cosine"}, r"loss\.margin_warmup\.shape must be linear \| exp"),
    ]:
        with pytest.raises(ConfigError, match=msg):
            build_loss({**cfg, "margin_warmup": bad}, 8, num_classes=4, source="conf/x.yaml")
    with pytest.raises(ConfigError, match="unknown key.*loss.margin_warmup"):
        build_loss({"name": "ge2e", "margin_warmup": {"start_epoch": 1, "end_epoch": 2}}, 8)
