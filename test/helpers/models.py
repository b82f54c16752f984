"""Tiny models with random weights: a stage-4-style spkflow model dir (with or without the scoring
stage 6 fits), a SpeechBrain pretrained folder and a WeSpeaker ONNX export (each written by its
toolkit's own code), BatchNorm statistics that make a padding leak show, L2 normalisation of
embeddings."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import yaml


def perturb_batchnorm(model, seed: int) -> None:
    """Non-trivial BatchNorm running statistics, so that a padding leak would show."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.BatchNorm1d):
                mod.running_mean.normal_(0.0, 0.5, generator=g)
                mod.running_var.uniform_(0.5, 2.0, generator=g)


def l2(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def make_spkflow_model_dir(
    path: Path, seed: int = 0, mean_norm: bool = False, channels: int = 32, num_mel_bins: int = 24, embed_dim: int = 16
) -> Path:
    """A stage-4-style model dir (config.yaml + model.pth) of an ECAPA with random weights (tiny by
    default; ``channels=512, num_mel_bins=80, embed_dim=192``: the ECAPA-512 of the papers)."""
    import torch

    from spkflow.features.fbank import FbankOptions
    from spkflow.features.vad import VadOptions
    from spkflow.nnet.models import build_model

    cfg = {
        "frontend": {
            "vad": True,
            "mean_norm": mean_norm,
            "fbank": FbankOptions(num_mel_bins=num_mel_bins).to_dict(),
            "vad_conf": dataclasses.asdict(VadOptions()),
        },
        "model": {
            "name": "ecapa_tdnn",
            "input_dim": num_mel_bins,
            "channels": channels,
            "scale": 4 if channels < 64 else 8,
            "embed_dim": embed_dim,
        },
    }
    torch.manual_seed(seed)
    model = build_model(cfg["model"])
    perturb_batchnorm(model, seed)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    torch.save(model.state_dict(), path / "model.pth")
    return path


def make_scored_model_dir(path: Path, audio_root: Path, seed: int = 0) -> Path:
    """A tiny model dir with a scoring, as stage 6 leaves it: a WCCN backend and an AS-norm cohort
    from the embeddings of a synthetic training set, and a calibration fitted on a second set's
    trials (``scoring.yaml`` + ``scoring.npz``).  Embedded in this process through the API."""
    import kaldiio

    from helpers.audio import make_speakers
    from spkflow import Embedder
    from spkflow.corpora.trials import make_trials, write_trials
    from spkflow.data.tables import read_kv
    from spkflow.score.backend import fit_backend
    from spkflow.score.model_scoring import fit_scoring

    model = make_spkflow_model_dir(path, seed=seed)
    emb = Embedder.from_pretrained(model)
    scps = {}
    for name, s, n_spk in (("train", seed + 10, 5), ("dev", seed + 11, 4)):
        data = make_speakers(audio_root / name, num_spk=n_spk, num_utt=3, seed=s)
        wav = read_kv(data / "wav.scp")
        vecs = {u: emb.embed_file(p) for u, p in wav.items()}
        with kaldiio.WriteHelper(f"ark,scp:{audio_root / name}.ark,{audio_root / name}.scp") as w:
            for u in sorted(vecs):
                w(u, vecs[u])
        scps[name] = (data, vecs)
    train_data, train_vecs = scps["train"]
    u2s = read_kv(train_data / "utt2spk")
    (path / "backend").mkdir()
    keys = sorted(train_vecs)
    fit_backend("wccn", np.stack([train_vecs[u] for u in keys]), [u2s[u] for u in keys]).save(
        path / "backend" / "wccn.npz"
    )
    means = {s: np.mean([v for u, v in train_vecs.items() if u2s[u] == s], axis=0) for s in set(u2s.values())}
    with kaldiio.WriteHelper(f"ark,scp:{audio_root}/cohort.ark,{audio_root}/cohort.scp") as w:
        for s in sorted(means):
            w(s, means[s].astype(np.float32))
    dev_data, _ = scps["dev"]
    write_trials(dev_data / "trials", make_trials(read_kv(dev_data / "utt2spk"), nontarget_ratio=100))
    fit_scoring(
        str(dev_data / "trials"),
        f"{audio_root}/dev.scp",
        backend_path=str(path / "backend" / "wccn.npz"),
        cohort_scp=f"{audio_root}/cohort.scp",
        cohort_size=3,
        set_name="dev",
    ).save(path)
    return path


# ----------------------------------------------------------------------------- other toolkits' formats

_ESPNET_BASE = dict(
    specaug=None,
    specaug_conf={},
    normalize=None,
    normalize_conf={},
    pooling="chn_attn_stat",
    pooling_conf={},
    projector="rawnet3",
    projector_conf=dict(output_size=16),
    loss="aamsoftmax",
    loss_conf=dict(margin=0.2, scale=30),
    spk_num=5,
    input_size=None,
    init=None,
)
#: Tiny ESPnet speaker models of each encoder family (SpeakerTask.build_model configs), as
#: ESPnet's recipes shape them.
ESPNET_CONFIGS = {
    # ESPnet's VoxCeleb ECAPA recipe shape: melspec_torch frontend with mean normalisation
    "ecapa": dict(
        _ESPNET_BASE,
        frontend="melspec_torch",
        frontend_conf=dict(preemp=True, n_fft=512, log=True, win_length=400, hop_length=160, n_mels=24, normalize="mn"),
        encoder="ecapa_tdnn",
        encoder_conf=dict(model_scale=4, ndim=32, output_size=48),
    ),
    # STFT frontend + utterance MVN; the x-vector TDNN shortens the time axis
    "xvector": dict(
        _ESPNET_BASE,
        frontend="default",
        frontend_conf=dict(n_fft=512, win_length=400, hop_length=160, n_mels=24),
        normalize="utterance_mvn",
        encoder="xvector",
        encoder_conf=dict(ndim=32, output_size=40),
        pooling="stats",
        projector="xvector",
    ),
    # raw waveform; its AFMS blocks average over time with F.adaptive_avg_pool1d, MaxPool1d shortens
    "rawnet3": dict(
        _ESPNET_BASE,
        frontend="asteroid_frontend",
        frontend_conf=dict(sinc_stride=16, sinc_kernel_size=251, sinc_filters=32),
        encoder="rawnet3",
        encoder_conf=dict(model_scale=4, ndim=32, output_size=48),
    ),
    # WeSpeaker's ResNet: Conv2d on [B, 1, F, T], strided three times
    "resnet": dict(
        _ESPNET_BASE,
        frontend="default",
        frontend_conf=dict(n_fft=512, win_length=400, hop_length=160, n_mels=24),
        normalize="utterance_mvn",
        encoder="resnet",
        encoder_conf=dict(m_channels=4),
        pooling="stats",
        projector="xvector",
    ),
    # MFA-Conformer as ESPnet's VoxCeleb recipe sets it (latest relative positions, macaron, conv module)
    "conformer": dict(
        _ESPNET_BASE,
        frontend="melspec_torch",
        frontend_conf=dict(preemp=True, n_fft=512, log=True, win_length=400, hop_length=160, n_mels=24, normalize="mn"),
        encoder="mfaconformer",
        encoder_conf=dict(
            output_size=16,
            attention_heads=2,
            linear_units=32,
            num_blocks=2,
            cnn_module_kernel=7,
            macaron_style=True,
            rel_pos_type="latest",
            pos_enc_layer_type="rel_pos",
            selfattention_layer_type="rel_selfattn",
        ),
    ),
    # the encoder's defaults: ESPnet's legacy relative attention, which padding changes
    "conformer_legacy": dict(
        _ESPNET_BASE,
        frontend="melspec_torch",
        frontend_conf=dict(preemp=True, n_fft=512, log=True, win_length=400, hop_length=160, n_mels=24, normalize="mn"),
        encoder="mfaconformer",
        encoder_conf=dict(output_size=16, attention_heads=2, linear_units=32, num_blocks=2, cnn_module_kernel=7),
    ),
}


def save_espnet_model(path: Path, cfg: dict, seed: int = 0) -> Path:
    """An ESPnet speaker model dir (config.yaml + model.pth) built by ``SpeakerTask.build_model``
    from ``cfg``, ESPnet's random init with non-trivial BatchNorm statistics.  Returns ``path``."""
    import argparse

    import torch
    from espnet2.tasks.spk import SpeakerTask

    torch.manual_seed(seed)
    model = SpeakerTask.build_model(argparse.Namespace(**cfg))
    perturb_batchnorm(model, seed)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    torch.save(model.state_dict(), path / "model.pth")
    return path


#: SpeechBrain encoders in the layout of speechbrain/spkrec-ecapa-voxceleb and spkrec-xvect-voxceleb, tiny
SB_ENCODERS = {
    "ecapa": """embedding_model: !new:speechbrain.lobes.models.ECAPA_TDNN.ECAPA_TDNN
    input_size: !ref <n_mels>
    channels: [32, 32, 32, 32, 96]
    kernel_sizes: [5, 3, 3, 3, 1]
    dilations: [1, 2, 3, 4, 1]
    attention_channels: 16
    lin_neurons: 16
classifier: !new:speechbrain.lobes.models.ECAPA_TDNN.Classifier
    input_size: 16
    out_neurons: !ref <out_n_neurons>
""",
    "xvector": """embedding_model: !new:speechbrain.lobes.models.Xvector.Xvector
    in_channels: !ref <n_mels>
    activation: !name:torch.nn.LeakyReLU
    tdnn_blocks: 5
    tdnn_channels: [32, 32, 32, 32, 96]
    tdnn_kernel_sizes: [5, 3, 3, 1, 1]
    tdnn_dilations: [1, 2, 3, 1, 1]
    lin_neurons: 16
classifier: !new:speechbrain.lobes.models.Xvector.Classifier
    input_shape: [null, null, 16]
    activation: !name:torch.nn.LeakyReLU
    lin_blocks: 1
    lin_neurons: 16
    out_neurons: !ref <out_n_neurons>
""",
}

_SB_HPARAMS = """# A pretrained folder as SpeechBrain publishes them (speechbrain/spkrec-*-voxceleb), tiny
n_mels: 24
pretrained_path: speechbrain/spkrec-ecapa-voxceleb
out_n_neurons: 5
compute_features: !new:speechbrain.lobes.features.Fbank
    n_mels: !ref <n_mels>
mean_var_norm: !new:speechbrain.processing.features.InputNormalization
    norm_type: sentence
    std_norm: False
{encoder}mean_var_norm_emb: !new:speechbrain.processing.features.InputNormalization
    norm_type: global
    std_norm: False
modules:
    compute_features: !ref <compute_features>
    mean_var_norm: !ref <mean_var_norm>
    embedding_model: !ref <embedding_model>
    mean_var_norm_emb: !ref <mean_var_norm_emb>
    classifier: !ref <classifier>
label_encoder: !new:speechbrain.dataio.encoder.CategoricalEncoder
pretrainer: !new:speechbrain.utils.parameter_transfer.Pretrainer
    loadables:
        embedding_model: !ref <embedding_model>
        mean_var_norm_emb: !ref <mean_var_norm_emb>
        classifier: !ref <classifier>
        label_encoder: !ref <label_encoder>
    paths:
        embedding_model: !ref <pretrained_path>/embedding_model.ckpt
        mean_var_norm_emb: !ref <pretrained_path>/mean_var_norm_emb.ckpt
        classifier: !ref <pretrained_path>/classifier.ckpt
        label_encoder: !ref <pretrained_path>/label_encoder.txt
"""


def make_speechbrain_dir(path: Path, kind: str = "ecapa", seed: int = 0) -> Path:
    """A SpeechBrain pretrained folder built by SpeechBrain's own code: hyperparams.yaml (its hub
    layout, ``pretrained_path`` naming the hub repo), the encoder's and classifier's random
    weights and the embedding normaliser saved by SpeechBrain's checkpoint hooks, the label
    encoder by ``CategoricalEncoder.save``.  Returns ``path``."""
    import torch
    from hyperpyyaml import load_hyperpyyaml
    from speechbrain.utils.checkpoints import DEFAULT_SAVE_HOOKS, get_default_hook

    text = _SB_HPARAMS.format(encoder=SB_ENCODERS[kind])
    path.mkdir(parents=True, exist_ok=True)
    (path / "hyperparams.yaml").write_text(text)
    torch.manual_seed(seed)
    hp = load_hyperpyyaml(text)
    perturb_batchnorm(hp["embedding_model"], seed)
    norm = hp["mean_var_norm_emb"]
    norm.train()
    norm(torch.randn(7, 16), torch.ones(7))  # global statistics, as after training
    norm.eval()
    for name in ("embedding_model", "mean_var_norm_emb", "classifier"):
        get_default_hook(hp[name], DEFAULT_SAVE_HOOKS)(hp[name], path / f"{name}.ckpt")
    labels = hp["label_encoder"]
    labels.update_from_iterable([f"id{i:05d}" for i in range(5)])
    labels.save(path / "label_encoder.txt")
    return path


def make_wespeaker_onnx(path: Path, feat_dim: int = 80, seed: int = 0) -> Path:
    """An ONNX file as ``wespeaker/bin/export_onnx.py`` writes it (input ``feats`` [B, T, F] with
    dynamic B and T, output ``embs`` [B, D], opset 14), from a small torch model of WeSpeaker's
    ResNet-TSTP shape: ESPnet's ResNet encoder (adapted from WeSpeaker's), mean and standard
    deviation over time, a linear layer; random weights.  Returns ``path``."""
    import torch
    from espnet2.spk.encoder.resnet_encoder import ResNetEncoder

    class ResNetTSTP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.front = ResNetEncoder(input_size=feat_dim, m_channels=4)
            self.seg_1 = torch.nn.Linear(self.front.output_size() * 2, 16)

        def forward(self, feats: torch.Tensor) -> torch.Tensor:
            x = self.front(feats)  # [B, D, T']
            stats = torch.cat([x.mean(dim=-1), torch.sqrt(torch.var(x, dim=-1) + 1e-7)], dim=-1)
            return self.seg_1(stats)

    torch.manual_seed(seed)
    model = ResNetTSTP().eval()
    for mod in model.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            mod.running_mean.normal_(0.0, 0.5)
            mod.running_var.uniform_(0.5, 2.0)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.onnx.export(
        model,
        torch.ones(1, 200, feat_dim),
        str(path),
        do_constant_folding=True,
        opset_version=14,
        export_params=True,
        input_names=["feats"],
        output_names=["embs"],
        dynamic_axes={"feats": {0: "B", 1: "T"}, "embs": {0: "B"}},
        dynamo=False,
    )
    return path
