"""The optimiser's weight decay groups (``optim.decay_1d``), on a real module and real steps."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from spkflow.train.optim import build_optimizer


def _step_with_zero_grads(name: str, decay_1d: bool) -> dict[str, float]:
    """One optimiser step with all-zero gradients: Adam's and SGD's own update is then zero, so
    each parameter's change is the decay alone. Returns new / old value per parameter."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(4, 8, 3), nn.BatchNorm1d(8), nn.Linear(6, 5))
    nn.init.normal_(model[1].bias)  # BatchNorm's shift starts at 0: give it something to decay
    scale = nn.Parameter(torch.tensor([10.0]))  # a loss scalar such as GE2E's w
    params = [*model.parameters(), scale]
    names = [n for n, _ in model.named_parameters()] + ["scale"]
    before = [p.detach().clone() for p in params]
    opt = build_optimizer({"name": name, "lr": 0.1, "weight_decay": 0.5, "decay_1d": decay_1d, "momentum": 0.9}, params)
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()
    return {n: float(p.detach().norm() / b.norm()) for n, p, b in zip(names, params, before, strict=True)}


@pytest.mark.parametrize("name", ["adamw", "sgd", "adam"])
def test_decay_1d_false_leaves_biases_norms_and_scalars_alone(name: str) -> None:
    ratio = _step_with_zero_grads(name, decay_1d=False)
    for n, r in ratio.items():
        if n in ("0.weight", "2.weight"):  # the conv kernel and the linear matrix
            if name == "adam":  # L2 through Adam's normalisation: shrinks, by no fixed factor
                assert r < 1.0, n
            else:
                assert r == pytest.approx(1 - 0.1 * 0.5, rel=1e-6), n
        else:  # biases, BatchNorm's scale and shift, the loss scalar
            assert r == 1.0, n


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_decay_1d_true_decays_every_parameter(name: str) -> None:
    ratio = _step_with_zero_grads(name, decay_1d=True)
    assert all(r == pytest.approx(0.95, rel=1e-6) for r in ratio.values()), ratio


def test_decay_1d_must_be_a_bool(tmp_path) -> None:
    from spkflow.core.checks import ConfigError
    from spkflow.train.config import load_train_config

    conf = tmp_path / "train.yaml"
    conf.write_text("model:\n  name: ecapa_tdnn\nloss:\n  name: ge2e\noptim:\n  name: adamw\n  decay_1d: 'no'\n")
    with pytest.raises(ConfigError, match=r"train\.yaml.*optim\.decay_1d must be true or false"):
        load_train_config(conf)


# --------------------------------------------------------------------------- the schedule


def _lrs(cfg: dict, optim: dict, world_size: int, per_rank_batch: int, batches: int, epochs: int) -> list[float]:
    """The rate of every step of a run at ``world_size`` ranks (each taking ``batches // world_size``
    of an epoch's batches), stepping a real optimiser and scheduler as the trainer does."""
    from spkflow.train.optim import build_scheduler, lr_scale

    p = nn.Parameter(torch.zeros(2))
    opt = build_optimizer({"weight_decay": 0.0, "decay_1d": True, "momentum": 0.9, **optim}, [p])
    spe = batches // world_size
    sched = build_scheduler(cfg, opt, spe * epochs, spe, lr_scale(optim, world_size * per_rank_batch))
    out = []
    for _ in range(spe * epochs):
        out.append(sched.get_last_lr()[0])
        opt.step()
        sched.step()
    return out


@pytest.mark.parametrize("name", ["warmup_cosine", "warmup_exponential", "exponential", "constant"])
def test_schedule_per_sample_is_the_same_at_1_2_4_ranks(name: str) -> None:
    """With optim.lr_ref_batch and scheduler.warmup_epochs, the rate per utterance of a step
    (lr / global batch) is one function of the samples seen before it, at W = 1, 2 and 4 ranks:
    W's step k starts where W=1's step k*W does and has W times its rate.  Without the scaling or
    with the warm-up in steps it would not be (checked too)."""
    cfg = {"name": name, "warmup_steps": 0, "warmup_epochs": 1.5, "final_lr_ratio": 0.01, "gamma": 0.5}
    optim = {"name": "sgd", "lr": 0.2, "lr_ref_batch": 64}
    b, batches, epochs = 32, 48, 4  # 32 utterances per rank, 48 batches per epoch
    one = _lrs(cfg, optim, 1, b, batches, epochs)
    if name in ("constant", "warmup_cosine"):  # at the end of the warm-up (1.5 x 48 steps): the scaled peak
        assert one[72] == pytest.approx(0.2 * 32 / 64) and one[71] < one[72]
    for w in (2, 4):
        mine = _lrs(cfg, optim, w, b, batches, epochs)
        assert len(mine) * w == len(one)
        per_sample = [lr / (w * b) for lr in mine]
        ref = [one[k * w] / b for k in range(len(mine))]
        assert per_sample == pytest.approx(ref, rel=1e-12, abs=1e-15), w
    # the old ways differ: unscaled rates, or a warm-up counted in steps
    unscaled = _lrs(cfg, {**optim, "lr_ref_batch": None}, 4, b, batches, epochs)
    assert unscaled[-1] / (4 * b) != pytest.approx(one[-4] / b)
    if name != "constant":
        in_steps = _lrs({**cfg, "warmup_epochs": None, "warmup_steps": 72}, optim, 4, b, batches, epochs)
        assert in_steps[9] / (4 * b) < 0.9 * one[36] / b  # 72 steps is 6 epochs at W=4, 1.5 at W=1


def _lr_factor_before_issue_34(cfg, total_steps: int, steps_per_epoch: int):
    """spkflow.train.optim.lr_factor as it was before optim.lr_ref_batch and warmup_epochs
    (commit f6e377d), kept here to check the demo's schedule did not move."""
    import math

    name, warm = cfg["name"], int(cfg["warmup_steps"])
    final, gamma = float(cfg["final_lr_ratio"]), float(cfg["gamma"])

    def f(step: int) -> float:
        w = min(1.0, (step + 1) / warm) if warm > 0 else 1.0
        if name == "constant":
            return w
        if name == "exponential":
            return w * gamma ** (step // max(1, steps_per_epoch))
        t = min(1.0, max(0, step - warm) / max(1, total_steps - warm))
        return w * (final + (1.0 - final) * 0.5 * (1.0 + math.cos(math.pi * t)))

    return f


def test_demo_schedule_is_bit_identical_to_before() -> None:
    """The demo (egs/speechocean762/spk1: conf/train.yaml, run.sh's 84 epochs of 64 x 2) sets no
    lr_ref_batch: its rate at every step, at W = 1 (and at W = 2: nothing scales without a
    reference), is exactly the one of the code before the scaling (the demo's 11 batches per
    epoch and other epoch lengths)."""
    import re

    from helpers.paths import ROOT
    from spkflow.train.config import load_train_config

    recipe = ROOT / "egs" / "speechocean762" / "spk1"
    cfg = load_train_config(recipe / "conf" / "train.yaml")
    run_sh = (recipe / "run.sh").read_text()
    epochs = int(re.search(r"^num_epochs=(\d+)", run_sh, re.M).group(1))
    per_rank = int(re.search(r"^num_spk=(\d+)", run_sh, re.M).group(1)) * int(
        re.search(r"^num_utt=(\d+)", run_sh, re.M).group(1)
    )
    assert cfg["optim"]["lr_ref_batch"] is None and cfg["scheduler"]["warmup_epochs"] is None
    for spe in (11, 1, 7, 64):
        p = nn.Parameter(torch.zeros(2))
        opt = build_optimizer(cfg["optim"], [p])
        old = torch.optim.lr_scheduler.LambdaLR(opt, _lr_factor_before_issue_34(cfg["scheduler"], spe * epochs, spe))
        before = []
        for _ in range(spe * epochs):
            before.append(old.get_last_lr()[0])
            opt.step()
            old.step()
        assert _lrs(cfg["scheduler"], cfg["optim"], 1, per_rank, spe, epochs) == before  # exactly
        assert _lrs(cfg["scheduler"], cfg["optim"], 2, per_rank, 2 * spe, epochs) == before  # no reference: no scaling
