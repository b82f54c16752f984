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
