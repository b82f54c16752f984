"""Speaker embedders: padding invariance, config errors, model-dir round trip (weights_only)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import yaml

from helpers.paths import ROOT
from helpers.spread import permuted, within
from spkflow.core.checks import ConfigError
from spkflow.nnet.models import DVectorLSTM, EcapaTdnn, ResNet, build_model, load_model_dir

torch.set_num_threads(1)

ECAPA = {"name": "ecapa_tdnn", "input_dim": 20, "channels": 32, "scale": 4, "embed_dim": 16}
# espnet2's ResNet with one block per stage and 4 channels (20 mel bins: frequency 20 -> 10 -> 5 -> 3)
RESNET = {
    "name": "resnet",
    "input_dim": 20,
    "resnet_type": "resnet34",
    "num_blocks": [1, 1, 1, 1],
    "channels": 4,
    "embed_dim": 16,
}
LSTM = {
    "name": "dvector_lstm",
    "input_dim": 20,
    "hidden": 24,
    "embed_dim": 12,
    "layers": 2,
    "infer_window": 30,
    "infer_hop": 15,
}


def _trained_bn(model: torch.nn.Module) -> torch.nn.Module:
    """A few training-mode passes so BatchNorm statistics are not the identity."""
    g = torch.Generator().manual_seed(1)
    model.set_input_stats(torch.full((20,), 1.0), torch.full((20,), 2.0))
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(6, 40, 20, generator=g) * 3 + 1, None)
    return model.eval()


def _padded_vs_alone(model: torch.nn.Module, lengths: list[int], pad_value: float) -> float:
    lengths = permuted(lengths)  # the batch order under test (helpers.spread)
    g = torch.Generator().manual_seed(0)
    t = max(lengths) + 7
    x = torch.randn(len(lengths), t, 20, generator=g) * 2 + 1
    for i, n in enumerate(lengths):
        x[i, n:] = pad_value  # whatever the caller pads with
    with torch.no_grad():
        batch = F.normalize(model(x, torch.tensor(lengths)), dim=-1)
        worst = 0.0
        for i, n in enumerate(lengths):
            alone = F.normalize(model(x[i : i + 1, :n], torch.tensor([n])), dim=-1)[0]
            worst = max(worst, float((batch[i] - alone).abs().max()))
    return worst


@pytest.mark.parametrize(
    "cfg",
    [ECAPA, RESNET, {**RESNET, "resnet_type": "resnet50"}, LSTM, {**LSTM, "infer_window": 0}],
    ids=["ecapa", "resnet-basic", "resnet-bottleneck", "lstm-window", "lstm"],
)
@pytest.mark.parametrize("pad_value", [0.0, 50.0])
def test_padded_utterance_gets_the_embedding_it_gets_alone(cfg: dict, pad_value: float) -> None:
    torch.manual_seed(0)
    model = _trained_bn(build_model(cfg))
    # measured <= 2.7e-7 (1 and 2 threads, batch order permuted)
    within("padded vs alone (L2-normalised)", _padded_vs_alone(model, [90, 37, 61, 12], pad_value), 1e-4)


@pytest.mark.parametrize("lengths", [[64, 1, 2, 3, 9], [41, 40, 17, 16, 15]], ids=["tiny", "odd-even"])
def test_resnet_padding_invariance_through_the_strided_stages(lengths: list[int]) -> None:
    """Odd and even lengths either side of each stride-2 stage (L -> (L - 1) // 2 + 1), down to one
    frame, in espnet2's full ResNet34 layout (3-4-6-3 blocks)."""
    torch.manual_seed(0)
    model = _trained_bn(build_model({**RESNET, "num_blocks": None}))
    # measured <= 2.7e-7 (1 and 2 threads, batch order permuted)
    within("padded vs alone (L2-normalised)", _padded_vs_alone(model, lengths, 50.0), 1e-4)


def test_espnet2_resnet_without_masks_is_not_padding_invariant() -> None:
    """Why ResNet.encode masks: espnet2's own forward changes a padded utterance's frames."""
    from espnet2.spk.encoder.resnet_encoder import ResNetEncoder

    torch.manual_seed(0)
    model = _trained_bn(build_model(RESNET))
    assert isinstance(model, ResNet) and isinstance(model.encoder, ResNetEncoder)
    x = torch.randn(1, 50, 20)
    with torch.no_grad():
        xn = (x - model.input_mean) / model.input_std
        pn = torch.cat([xn, torch.zeros(1, 30, 20)], dim=1)
        raw_alone = model.encoder(xn.clone())
        raw_padded = model.encoder(pn.clone())[..., :7]  # 50 frames -> 25 -> 13 -> 7
        ours_alone, n_alone = model.encode(xn, torch.tensor([50]))
        ours_padded, n_padded = model.encode(pn, torch.tensor([50]))
    assert n_alone.tolist() == n_padded.tolist() == [7] and ours_padded.shape[-1] == 10
    assert float((raw_alone - raw_padded).abs().max()) > 1e-3
    # measured 0 (1 and 2 threads, batch order permuted)
    within("ResNet.encode padded vs alone", float((ours_alone - ours_padded[..., :7]).abs().max()), 1e-4)
    torch.testing.assert_close(ours_alone, raw_alone, rtol=1e-5, atol=1e-5)  # same network and layout unpadded
    enc = ResNetEncoder(20, num_blocks=(1, 1, 1, 1), m_channels=4)
    assert {k.split(".", 1)[1] for k in model.state_dict() if k.startswith("encoder.")} == set(enc.state_dict())


def test_resnet34_size_and_training_step() -> None:
    """The default is espnet2's ResNet34 (WeSpeaker's ResNet34-TSTP-emb256: 6.63 M parameters; ours
    adds the projector's input BatchNorm); a tiny one runs forward and backward in training mode."""
    big = build_model({"name": "resnet"})
    assert sum(p.numel() for p in big.parameters()) == 6_644_576 and big.embed_dim == 256
    assert big.frame_dim == big.encoder.output_size() == 2560  # 80 bins -> 10, x 256 channels
    torch.manual_seed(0)
    model = build_model({**RESNET, "specaug": {"freq_width": 3, "time_width": 4}}).train()
    x = torch.randn(6, 40, 20)
    emb = model(x, torch.full((6,), 40))
    assert emb.shape == (6, 16)
    F.normalize(emb, dim=-1)[:, 0].sum().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
    assert float(model.encoder.conv1.weight.grad.abs().sum()) > 0


def test_espnet2_encoder_without_masks_is_not_padding_invariant() -> None:
    """Why EcapaTdnn.encode masks: espnet2's own forward changes a padded utterance's output."""
    torch.manual_seed(0)
    model = _trained_bn(build_model(ECAPA))
    x = torch.randn(1, 50, 20)
    padded = torch.cat([x, torch.zeros(1, 30, 20)], dim=1)
    with torch.no_grad():
        xn = (x - model.input_mean) / model.input_std
        pn = torch.cat([xn, torch.zeros(1, 30, 20)], dim=1)
        raw_alone = model.encoder(xn)[..., :50]
        raw_padded = model.encoder(pn)[..., :50]
        ours_alone = model.encode(xn, torch.tensor([50]))
        ours_padded = model.encode(pn, torch.tensor([50]))[..., :50]
    assert float((raw_alone - raw_padded).abs().max()) > 1e-3
    # measured 0 (1 and 2 threads, batch order permuted)
    within("EcapaTdnn.encode padded vs alone", float((ours_alone - ours_padded).abs().max()), 1e-4)
    torch.testing.assert_close(ours_alone, raw_alone, rtol=1e-4, atol=1e-4)  # same network when unpadded
    assert model(padded, torch.tensor([50])).shape == (1, 16)


def test_state_dict_keys_are_espnet2s() -> None:
    from espnet2.spk.encoder.ecapa_tdnn_encoder import EcapaTdnnEncoder

    model = build_model(ECAPA)
    enc = EcapaTdnnEncoder(20, model_scale=4, ndim=32, output_size=96)
    assert {k.split(".", 1)[1] for k in model.state_dict() if k.startswith("encoder.")} == set(enc.state_dict())


def test_shapes_and_paper_lstm() -> None:
    assert isinstance(build_model(ECAPA), EcapaTdnn)
    paper = build_model({"name": "dvector_lstm"})  # 3 x 768 with projection 256 on 40-dim input
    assert isinstance(paper, DVectorLSTM) and paper.embed_dim == 256
    assert paper.lstm.num_layers == 3 and paper.lstm.hidden_size == 768 and paper.lstm.proj_size == 256
    m = build_model(ECAPA).eval()
    with pytest.raises(ValueError, match=r"feats \[B, T, 20\]"):
        m(torch.zeros(2, 10, 21), torch.tensor([10, 10]))
    with pytest.raises(ValueError, match="lengths"):
        m(torch.zeros(2, 10, 20), torch.tensor([10, 11]))


@pytest.mark.parametrize(
    "cfg, match",
    [
        ({**ECAPA, "chanels": 8}, "chanels"),
        ({**ECAPA, "name": "xvector"}, "model.name"),
        ({**RESNET, "scale": 4}, "model.scale"),
        ({**RESNET, "resnet_type": "resnet35"}, "model.resnet_type"),
        ({**RESNET, "num_blocks": [1, 1, 1]}, "model.num_blocks"),
        ({**RESNET, "channels": 0}, "model.channels"),
        ({k: v for k, v in ECAPA.items() if k != "name"}, "model.name"),
        ({**LSTM, "hidden_size": 8}, "hidden_size"),
        ({**ECAPA, "specaug": {"freq_mask": 3}}, "freq_mask"),
        ({**ECAPA, "input_norm": "utterance"}, "input_norm"),
        ({**ECAPA, "channels": 30}, "multiple"),
    ],
)
def test_config_errors(cfg: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        build_model(cfg)


def test_resnet_values_are_config_errors_at_load(tmp_path: Path) -> None:
    """A wrong depth in a training config file is found when the file is loaded, naming file and key."""
    from spkflow.train.config import load_train_config

    shipped = ROOT / "egs/voxceleb/spk1/conf/train_resnet34_aam.yaml"
    cfg = yaml.safe_load(shipped.read_text())
    assert load_train_config(shipped)["model"]["resnet_type"] == "resnet34"
    for key, value, match in [
        ("resnet_type", "ResNet34", r"model\.resnet_type must be resnet18 \| resnet34"),
        ("num_blocks", [3, 4, 6], r"model\.num_blocks must be four integers"),
        ("channels", 32.5, r"model\.channels must be an integer"),
        ("m_channels", 32, r"unknown key\(s\) model\.m_channels"),
    ]:
        path = tmp_path / "train.yaml"
        path.write_text(yaml.safe_dump({**cfg, "model": {**cfg["model"], key: value}}))
        with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))}: {match}"):
            load_train_config(path)


def test_specaug_only_in_training() -> None:
    model = build_model({**ECAPA, "specaug": {"freq_width": 8, "time_width": 10}})
    x = torch.randn(4, 40, 20)
    lengths = torch.tensor([40, 30, 20, 10])
    model.train()
    torch.manual_seed(3)
    masked = model.specaug(x, lengths)
    assert (masked == 0).any() and not torch.equal(masked, x)
    model.eval()
    assert torch.equal(model.specaug(x, lengths), x)


def test_load_model_dir_round_trip(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _trained_bn(build_model(ECAPA))
    cfg = {
        "frontend": {"vad": True, "mean_norm": False, "fbank": {"num_mel_bins": 20}},
        "model": ECAPA,
        "loss": {"name": "ge2e"},
    }
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    torch.save(model.state_dict(), tmp_path / "model.pth")
    state = torch.load(tmp_path / "model.pth", weights_only=True)
    assert "input_mean" in state and float(state["input_mean"][0]) == 1.0  # input stats travel with the model
    loaded, config = load_model_dir(tmp_path)
    assert not loaded.training and config["frontend"]["vad"] is True
    x = torch.randn(2, 33, 20)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x, torch.tensor([33, 20])), model(x, torch.tensor([33, 20])))
    # a model.pth that does not fit the config is an error naming the file
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({**cfg, "model": {**ECAPA, "channels": 64}}))
    with pytest.raises(ConfigError, match="model.pth"):
        load_model_dir(tmp_path)
    with pytest.raises(FileNotFoundError, match="config.yaml"):
        load_model_dir(tmp_path / "nowhere")


@pytest.mark.parametrize("lengths", [[300], [300, 170, 64], [65, 300]])
def test_a_long_input_pools_in_blocks_to_the_same_embedding(monkeypatch, lengths: list[int]) -> None:
    """ECAPA's inference pooling in blocks (POOL_BLOCK frames of the attention at a time; a
    10-minute clip's [3C, T] attention input took 235 MB at once) gives what espnet2's one-piece
    pooling gives: bit for bit on one thread (as stage 5's jobs run), padded frames included, and
    the training path (grad enabled) keeps espnet2's module.  POOL_BLOCK 64 stands for 4096 here."""
    import spkflow.nnet.models as models

    torch.manual_seed(0)
    model = _trained_bn(build_model(ECAPA))
    g = torch.Generator().manual_seed(3)
    x = torch.randn(len(lengths), max(lengths), 20, generator=g) * 2 + 1
    n = torch.tensor(lengths)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the guarantee's condition: a test before this one may have left more
    try:
        with torch.inference_mode():
            one_piece = model(x, n)
            monkeypatch.setattr(models, "POOL_BLOCK", 64)
            blocks = model(x, n)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(blocks, one_piece)
    model.pooling.forward = None  # the blocks never call espnet2's module ...
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            assert torch.equal(model(x, n), one_piece)
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(TypeError):  # ... which training (and a grad-enabled call) does
        model(x, n)
