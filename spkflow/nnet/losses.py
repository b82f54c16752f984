"""Speaker-embedding training losses with one calling convention.

Every loss is a :class:`SpeakerLoss` and is called the same way::

    loss = build_loss({"name": "ge2e_xs"}, embed_dim=256)
    value = loss(emb)                  # emb: FloatTensor [N, M, D], speaker-major
    value = loss(emb, labels)          # labels: LongTensor [N] (needed when loss.needs_labels)

``emb[j, i]`` is the embedding of the i-th utterance of the j-th speaker of the batch (the
N x M batch lists of stage 3 are speaker-major, so ``feats``-order embeddings of shape
``[N*M, D]`` become ``emb.view(N, M, D)``).  ``labels[j]`` is the global training-set index
of speaker j (``0 <= labels[j] < num_classes``); only the classification losses
(``needs_labels`` is True: AAM-softmax) use it; the GE2E family ignores it, because its
targets are the batch positions themselves.  :func:`batch_labels` derives ``labels`` from
the batch's utterance ids and checks the speaker-major layout on the way.  A ``[B, D]``
embedding matrix with ``labels [B]`` is also accepted by the classification losses.
Every loss returns a scalar: the **mean** over the N*M utterances (Wan et al. write a sum;
the mean keeps the learning rate independent of the batch size, as google/speaker-id does).

Losses: ``ge2e`` (:class:`GE2ELoss`, Wan et al., ICASSP 2018, softmax or contrast form),
``ge2e_xs`` (:class:`GE2EXSLoss`, the extended-set softmax of Pelecanos et al., Interspeech 2021,
checked against google/speaker-id's reference), ``aamsoftmax`` / ``aamsoftmax_subcenter``
(:class:`AAMSoftmaxLoss`, espnet2's classification losses).  The GE2E family takes
``centroids: exclusive`` (Wan et al.) or ``split`` (google/speaker-id), and keeps its scale
``w > 0`` by a softplus reparametrisation.  Formulas, centroid rules, the reasons and the
comparison with the anchors: docs/losses.md.

Guarantees: every loss takes any N x M batch (shapes and missing labels raise errors that say
what is wrong); :func:`build_loss` turns an unknown name or key, or a value the loss cannot
take, into a :class:`~spkflow.core.checks.ConfigError` naming the config file and the key.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from spkflow.core.checks import ConfigError, check_choice, check_keys, check_named_section

__all__ = [
    "SpeakerLoss",
    "GE2ELoss",
    "GE2EXSLoss",
    "AAMSoftmaxLoss",
    "build_loss",
    "check_loss_config",
    "batch_labels",
    "ge2e_scores",
    "LOSSES",
]

_EPS = 1e-8
W_MIN = 1e-3  # floor of the GE2E scale: w = W_MIN + softplus(w_raw) stays > 0 even in float32


def _inv_softplus(y: float) -> float:
    """x with softplus(x) == y (y > 0)."""
    if y <= 0:
        raise ValueError(f"init_w must be > 0, got {y}")
    return y + math.log(-math.expm1(-y))


def _check_emb(emb: torch.Tensor, min_utt: int = 1) -> None:
    if emb.dim() != 3:
        raise ValueError(f"expected embeddings shaped [N, M, D], got {tuple(emb.shape)}")
    n, m, _ = emb.shape
    if n < 2:
        raise ValueError(f"a GE2E batch needs at least 2 speakers, got N={n}")
    if m < min_utt:
        raise ValueError(f"a GE2E batch needs at least {min_utt} utterances per speaker, got M={m}")


def ge2e_scores(emb: torch.Tensor, centroids: str = "exclusive") -> torch.Tensor:
    """Cosine similarity of every utterance to every speaker model of an N x M batch.

    Returns ``cos [N, M, N]`` with ``cos[j, i, k] = cos(e_ji, c_k)`` where the centroid
    rule is ``"exclusive"`` (Wan et al.: ``c_j^(-i)`` for k == j) or ``"split"``
    (parity split of google/speaker-id).  Embeddings are L2-normalised first.
    """
    n, m, d = emb.shape
    e = F.normalize(emb, dim=-1, eps=_EPS)
    if centroids == "exclusive":
        if m < 2:
            raise ValueError(f"exclusive centroids need M >= 2 utterances per speaker, got M={m}")
        total = e.sum(dim=1)  # [N, D]
        cent = F.normalize(total / m, dim=-1, eps=_EPS)  # [N, D]
        cos = torch.einsum("jid,kd->jik", e, cent)  # [N, M, N]
        excl = (total.unsqueeze(1) - e) / (m - 1)  # [N, M, D]: c_j^(-i)
        own = (e * F.normalize(excl, dim=-1, eps=_EPS)).sum(-1)  # [N, M]
        diag = torch.eye(n, dtype=torch.bool, device=emb.device).unsqueeze(1)  # [N, 1, N]
        return torch.where(diag, own.unsqueeze(-1), cos)
    if centroids == "split":
        if m % 2 != 0 or m < 2:
            raise ValueError(f"split centroids need an even M >= 2, got M={m}")
        even = F.normalize(e[:, 0::2].mean(dim=1), dim=-1, eps=_EPS)  # [N, D]
        odd = F.normalize(e[:, 1::2].mean(dim=1), dim=-1, eps=_EPS)
        # utterance i is scored against the centroids of the other parity
        models = torch.stack([odd if i % 2 == 0 else even for i in range(m)])  # [M, N, D]
        return torch.einsum("jid,ikd->jik", e, models)
    raise ValueError(f"centroids must be 'exclusive' or 'split', got {centroids!r}")


class SpeakerLoss(nn.Module):
    """Base class: ``forward(emb [N, M, D], labels [N] | None) -> scalar``.

    ``needs_labels``: the loss needs global speaker indices (``labels``).
    """

    needs_labels: bool = False

    def scalars(self) -> dict[str, float]:
        """Loss-internal quantities worth logging each step (e.g. ``w`` and ``b``)."""
        return {}

    def schedule(self, step: int, steps_per_epoch: int) -> None:
        """Set step-dependent hyper-parameters before step ``step`` (0-based); none by default."""


def margin_at(
    step: int, steps_per_epoch: int, final: float, start_epoch: int, end_epoch: int, shape: str = "linear"
) -> float:
    """The AAM margin before optimiser step ``step`` (0-based) under a warm-up.

    0 until the start of (1-based) epoch ``start_epoch``, then rising per step to ``final`` at
    the start of epoch ``end_epoch``, ``final`` after: linearly, or with ``shape="exp"`` as
    WeSpeaker's MarginScheduler (``increase_type: exp``) does, ``final x (1 - 0.001 ** p)`` at the
    fraction ``p`` of the ramp (fast at first, then flattening).  A pure function of the step,
    so a resumed run sees the margins of an uninterrupted one, whatever the world size.
    """
    begin, end = (start_epoch - 1) * steps_per_epoch, (end_epoch - 1) * steps_per_epoch
    if step <= begin:
        return 0.0
    if step >= end:
        return float(final)
    p = (step - begin) / (end - begin)
    return float(final) * (1.0 - 0.001**p if shape == "exp" else p)


class _ScaledCosine(SpeakerLoss):
    """Shared parameters of the GE2E family: w = softplus(w_raw) > 0 and b."""

    def __init__(self, init_w: float = 10.0, init_b: float = -5.0, centroids: str = "exclusive") -> None:
        super().__init__()
        if centroids not in ("exclusive", "split"):
            raise ValueError(f"centroids must be 'exclusive' or 'split', got {centroids!r}")
        self.centroids = centroids
        if not float(init_w) > W_MIN:
            raise ValueError(f"init_w must be > {W_MIN}, got {init_w}")
        self.w_raw = nn.Parameter(torch.tensor(_inv_softplus(float(init_w) - W_MIN)))
        self.b = nn.Parameter(torch.tensor(float(init_b)))

    @property
    def w(self) -> torch.Tensor:
        """The effective scale, always >= W_MIN > 0."""
        return F.softplus(self.w_raw) + W_MIN

    def logits(self, emb: torch.Tensor) -> torch.Tensor:
        """``S [N, M, N] = w * cos + b`` for the configured centroid rule."""
        _check_emb(emb, min_utt=2)
        if emb.dtype in (torch.float16, torch.bfloat16):
            emb = emb.float()  # under AMP: normalisation and log-sum-exp in float32
        cos = ge2e_scores(emb, self.centroids)
        return self.w.to(cos.dtype) * cos + self.b.to(cos.dtype)

    def scalars(self) -> dict[str, float]:
        return {"w": float(self.w.detach()), "b": float(self.b.detach())}

    def extra_repr(self) -> str:
        return f"centroids={self.centroids!r}"


class GE2ELoss(_ScaledCosine):
    """GE2E loss (Wan et al., ICASSP 2018) in ``"softmax"`` or ``"contrast"`` form.

    ``forward(emb [N, M, D], labels=None)`` returns the mean over the N*M utterances of
    ``L_ji`` (see the module docstring for the exact formulas and centroid rules).
    """

    def __init__(
        self, mode: str = "softmax", init_w: float = 10.0, init_b: float = -5.0, centroids: str = "exclusive"
    ) -> None:
        super().__init__(init_w, init_b, centroids)
        if mode not in ("softmax", "contrast"):
            raise ValueError(f"GE2E mode must be 'softmax' or 'contrast', got {mode!r}")
        self.mode = mode

    def forward(self, emb: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        s = self.logits(emb)  # [N, M, N]
        n = s.shape[0]
        diag = torch.eye(n, dtype=torch.bool, device=s.device).unsqueeze(1).expand_as(s)
        target = s.diagonal(dim1=0, dim2=2).transpose(0, 1)  # [N, M]: S[j, i, j]
        if self.mode == "softmax":
            # -t + log(e^t + sum_{k!=j} e^{s_k}) = softplus(lse_{k!=j} s_k - t)
            others = s.masked_fill(diag, float("-inf")).logsumexp(dim=-1)
            per_utt = F.softplus(others - target)
        else:
            hardest = torch.sigmoid(s).masked_fill(diag, float("-inf")).amax(dim=-1)
            per_utt = 1.0 - torch.sigmoid(target) + hardest
        return per_utt.mean()

    def extra_repr(self) -> str:
        return f"mode={self.mode!r}, " + super().extra_repr()


class GE2EXSLoss(_ScaledCosine):
    """GE2E extended-set softmax (Pelecanos et al., "Dr-Vectors", Interspeech 2021).

    Square i of the scaled scores is ``Q_i[j, k] = S[j, i, k]`` (i-th utterance of each
    speaker against the N speaker models).  Each target ``Q_i[j, j]`` is classified
    against itself plus the N(N-1) off-diagonal scores of its square:
    ``L_ji = softplus(logsumexp_{l != k} Q_i[l, k] - Q_i[j, j])``; the loss is the mean of
    ``L_ji`` over the N*M utterances.  This is google/speaker-id's
    ``GEnd2EndExtendedSetSoftmaxLayer`` (their 'stacked diagonal' matrices are these
    squares).  With ``centroids="split"`` it is that layer's default configuration
    (``split_batch=True``, no duplicate-speaker masking, w/b initialised to 10/-5, mean
    over utterances) except that w is kept positive; the default ``"exclusive"`` uses Wan
    et al.'s centroids, so that GE2E and GE2E-XS differ only in the softmax's competitors.
    """

    def forward(self, emb: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        s = self.logits(emb)  # [N, M, N]
        n = s.shape[0]
        diag = torch.eye(n, dtype=torch.bool, device=s.device).unsqueeze(1).expand_as(s)
        target = s.diagonal(dim1=0, dim2=2).transpose(0, 1)  # [N, M]
        square_non = s.masked_fill(diag, float("-inf")).transpose(0, 1).reshape(s.shape[1], -1)
        lse = square_non.logsumexp(dim=-1)  # [M]: one per square
        return F.softplus(lse.unsqueeze(0) - target).mean()


class AAMSoftmaxLoss(SpeakerLoss):
    """Additive angular margin softmax (optionally sub-center / inter-top-k) from espnet2.

    ``forward(emb, labels)``: ``emb [N, M, D]`` with ``labels [N]`` (or ``[N, M]``) global
    speaker indices, or ``emb [B, D]`` with ``labels [B]``.  Returns the mean
    cross-entropy; the last batch's accuracy is kept in ``last_accuracy``.
    """

    needs_labels = True

    def __init__(
        self,
        embed_dim: int,
        num_classes: int,
        margin: float = 0.2,
        scale: float = 30.0,
        easy_margin: bool = False,
        subcenter: bool = False,
        K: int = 3,
        mp: float = 0.06,
        k_top: int = 5,
        margin_warmup: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self.final_margin = float(margin)
        self.margin_warmup = dict(margin_warmup) if margin_warmup else None
        self.margin = float(margin)
        if num_classes is None or int(num_classes) < 2:
            raise ValueError(f"AAM-softmax needs num_classes >= 2 (training speakers), got {num_classes}")
        self.num_classes = int(num_classes)
        if subcenter:
            from espnet2.spk.loss.aamsoftmax_subcenter_intertopk import (
                ArcMarginProduct_intertopk_subcenter,
            )

            self.inner: nn.Module = ArcMarginProduct_intertopk_subcenter(
                embed_dim,
                self.num_classes,
                scale=scale,
                margin=margin,
                easy_margin=easy_margin,
                K=K,
                mp=mp,
                k_top=k_top,
            )
        else:
            from espnet2.spk.loss.aamsoftmax import AAMSoftmax

            self.inner = AAMSoftmax(embed_dim, self.num_classes, margin=margin, scale=scale, easy_margin=easy_margin)
        self.last_accuracy: float = float("nan")

    def forward(self, emb: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        if labels is None:
            raise ValueError("AAM-softmax needs labels: global speaker indices of the batch")
        labels = torch.as_tensor(labels, device=emb.device).long()
        if emb.dim() == 3:
            n, m, d = emb.shape
            if labels.shape == (n,):
                labels = labels.unsqueeze(1).expand(n, m)
            if labels.shape != (n, m):
                raise ValueError(f"labels must be [N]={n} or [N, M]=({n}, {m}), got {tuple(labels.shape)}")
            emb, labels = emb.reshape(n * m, d), labels.reshape(n * m)
        elif emb.dim() != 2 or labels.shape != emb.shape[:1]:
            raise ValueError(
                f"expected emb [N, M, D] + labels [N] or emb [B, D] + labels [B], "
                f"got {tuple(emb.shape)} and {tuple(labels.shape)}"
            )
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= self.num_classes):
            raise ValueError(
                f"speaker labels must lie in [0, {self.num_classes}), got [{int(labels.min())}, {int(labels.max())}]"
            )
        if emb.dtype in (torch.float16, torch.bfloat16):
            emb = emb.float()
        loss, acc, _ = self.inner(emb, labels)
        self.last_accuracy = float(acc.detach())
        return loss

    def scalars(self) -> dict[str, float]:
        return {"acc": self.last_accuracy, "margin": self.margin}

    def set_margin(self, margin: float) -> None:
        """Use ``margin`` from the next forward on (recomputes espnet2's cached trigonometry)."""
        inner = self.inner
        if hasattr(inner, "update"):  # the sub-center variant has its own (also scales mp)
            inner.update(margin)
        else:
            inner.m = margin
            inner.cos_m, inner.sin_m = math.cos(margin), math.sin(margin)
            inner.th = math.cos(math.pi - margin)
            inner.mm = math.sin(math.pi - margin) * margin
        self.margin = float(margin)

    def schedule(self, step: int, steps_per_epoch: int) -> None:
        if self.margin_warmup is not None:
            w = self.margin_warmup
            m = margin_at(
                step, steps_per_epoch, self.final_margin, w["start_epoch"], w["end_epoch"], w.get("shape", "linear")
            )
            if m != self.margin:
                self.set_margin(m)


LOSSES: dict[str, tuple[type[SpeakerLoss], dict[str, Any]]] = {
    # name: (class, fixed keyword arguments)
    "ge2e": (GE2ELoss, {}),
    "ge2e_xs": (GE2EXSLoss, {}),
    "aamsoftmax": (AAMSoftmaxLoss, {"subcenter": False}),
    "aamsoftmax_subcenter": (AAMSoftmaxLoss, {"subcenter": True}),
}

_ALLOWED: dict[str, tuple[str, ...]] = {
    "ge2e": ("mode", "init_w", "init_b", "centroids"),
    "ge2e_xs": ("init_w", "init_b", "centroids"),
    "aamsoftmax": ("margin", "scale", "easy_margin", "margin_warmup"),
    "aamsoftmax_subcenter": ("margin", "scale", "easy_margin", "K", "mp", "k_top", "margin_warmup"),
}


def _check_margin_warmup(value: Any, source: str) -> dict[str, Any]:
    """``{start_epoch: S, end_epoch: E, shape: linear|exp}`` with integers 1 <= S < E, else a ConfigError."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"{source}: loss.margin_warmup must be a mapping {{start_epoch, end_epoch}}, got {value!r}")
    check_keys("loss.margin_warmup", dict(value), ("start_epoch", "end_epoch", "shape"), source=source)
    out: dict[str, Any] = {"shape": value.get("shape", "linear")}
    check_choice(source, "loss.margin_warmup.shape", out["shape"], ("linear", "exp"))
    for key in ("start_epoch", "end_epoch"):
        v = value.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"{source}: loss.margin_warmup.{key} must be an integer epoch >= 1, got {v!r}")
        out[key] = v
    if out["end_epoch"] <= out["start_epoch"]:
        raise ConfigError(
            f"{source}: loss.margin_warmup.end_epoch ({out['end_epoch']}) must be after start_epoch "
            f"({out['start_epoch']})"
        )
    return out


def check_loss_config(cfg: Any, source: str = "config") -> tuple[str, dict[str, Any]]:
    """The loss ``name`` and its options, after checking both against the registry.

    Raises :class:`~spkflow.core.checks.ConfigError` naming ``source`` (the config file) and the key.
    """
    name, cfg = check_named_section("loss", cfg, _ALLOWED, source)
    if cfg.get("margin_warmup") is not None:
        cfg["margin_warmup"] = _check_margin_warmup(cfg["margin_warmup"], source)
    return name, cfg


def build_loss(
    cfg: Mapping[str, Any], embed_dim: int, num_classes: int | None = None, source: str = "config"
) -> SpeakerLoss:
    """Build a loss from its config section, e.g. ``{"name": "ge2e", "mode": "contrast"}``.

    ``name`` is one of ``ge2e``, ``ge2e_xs``, ``aamsoftmax``, ``aamsoftmax_subcenter``;
    the other keys are that loss's options (see ``_ALLOWED``).  An unknown name or key, or a
    value the loss cannot take, is a :class:`~spkflow.core.checks.ConfigError` naming ``source`` (the
    config file), the key and the accepted ones.  ``num_classes`` (training speakers) is
    required by the AAM losses and ignored by the GE2E family.
    """
    name, kwargs = check_loss_config(cfg, source)
    cls, fixed = LOSSES[name]
    if cls is AAMSoftmaxLoss and num_classes is None:
        raise ValueError(f"loss {name!r} needs num_classes (the number of training speakers)")
    try:
        if cls is AAMSoftmaxLoss:
            return AAMSoftmaxLoss(embed_dim, num_classes, **fixed, **kwargs)  # type: ignore[arg-type]
        return cls(**fixed, **kwargs)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{source}: loss ({name}): {err}") from None


def batch_labels(
    utt_ids: Sequence[str], utt2spk: Mapping[str, str], spk2idx: Mapping[str, int], num_utt: int
) -> torch.Tensor:
    """Global speaker indices ``[N]`` of a speaker-major batch of ``N * num_utt`` utterances.

    Raises ``ValueError`` when the batch is not speaker-major (a block of ``num_utt``
    utterances with more than one speaker), a speaker repeats across blocks, or an
    utterance or speaker is unknown.
    """
    if num_utt < 1 or len(utt_ids) % num_utt != 0:
        raise ValueError(f"batch of {len(utt_ids)} utterances is not a multiple of M={num_utt}")
    labels: list[int] = []
    seen: set[str] = set()
    for start in range(0, len(utt_ids), num_utt):
        block = utt_ids[start : start + num_utt]
        try:
            spks = {utt2spk[u] for u in block}
        except KeyError as err:
            raise ValueError(f"utterance {err.args[0]!r} of the batch is not in utt2spk") from None
        if len(spks) != 1:
            raise ValueError(f"batch is not speaker-major: utterances {list(block)} have speakers {sorted(spks)}")
        spk = spks.pop()
        if spk in seen:
            raise ValueError(f"speaker {spk!r} appears in two blocks of the batch")
        seen.add(spk)
        if spk not in spk2idx:
            raise ValueError(f"speaker {spk!r} has no class index (not a training speaker)")
        labels.append(int(spk2idx[spk]))
    return torch.tensor(labels, dtype=torch.long)
