"""Stage 5 with the frontend on the model's device (``--fbank-on device``: the DataLoader workers only
decode, resample and pad waveforms; fbank, VAD and frontend run batched in torch), on the CPU here:
the same embeddings as the numpy frontend in the workers, batched = alone, bad utterances named,
the option's choices.  The GPU runs of the same paths are CUDA-marked (test_embed_cuda.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import kaldiio
import numpy as np
import pytest

from helpers.audio import make_mixed_data, make_speakers
from helpers.models import l2, make_spkflow_model_dir
from helpers.recipes import SCRIPT, env
from helpers.spread import permuted, within
from spkflow.core.errors import UtteranceError
from spkflow.data.audio import OpenSamples
from spkflow.embed import loader as loader_module
from spkflow.embed import open_embedder
from spkflow.embed.native import SpkflowEmbedder
from spkflow.embed.run import read_vectors, run_job


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_spkflow_model_dir(tmp_path_factory.mktemp("model") / "spk_tiny", seed=5)


def vectors(job_dir: Path) -> dict[str, np.ndarray]:
    entries = []
    for scp in sorted(job_dir.glob("xvector.*.scp")):
        entries += [tuple(line.split(" ", 1)) for line in scp.read_text().splitlines()]
    return dict(zip([k for k, _ in entries], read_vectors(entries), strict=True))


@pytest.mark.parametrize("mean_norm, num_workers", [(False, 0), (True, 2)])
def test_device_frontend_gives_the_workers_embeddings(model_dir, tmp_path, mean_norm, num_workers):
    """8, 16 and 22.05 kHz audio (resampled in the workers either way), batches of mixed lengths;
    VAD, and VAD + mean normalisation."""
    if mean_norm:
        model_dir = make_spkflow_model_dir(tmp_path / "spk_mn", seed=6, mean_norm=True)
    data = make_mixed_data(tmp_path, num_spk=3, num_utt=4)
    utts = permuted((data / "utt2spk").read_text().split()[::2])
    workers = SpkflowEmbedder(model_dir, fbank_on="workers")
    device = SpkflowEmbedder(model_dir, fbank_on="device")
    assert (workers.fbank_on, device.fbank_on) == ("workers", "device")
    assert device.preparer(data)(utts[0]).ndim == 1  # the workers hand over waveforms
    kw = dict(batch_size=5, max_frames=1200, num_workers=num_workers, progress=False)
    run_job(workers, data, utts, tmp_path / "workers", **kw)
    run_job(device, data, utts, tmp_path / "device", **kw)
    a, b = vectors(tmp_path / "workers"), vectors(tmp_path / "device")
    assert sorted(a) == sorted(b) == sorted(utts)
    # torch's fbank vs numpy's (within 1e-5 on the log scale, test_torch_fbank.py) through the model:
    # measured <= 1.4e-6 (with mean normalisation; 1 and 2 threads, batch order permuted)
    worst = max(float(np.abs(l2(a[u]) - l2(b[u])).max()) for u in utts)
    within("device vs workers (L2-normalised)", worst, 2e-5)
    assert workers.stamp == device.stamp  # the same model and numbers: one job dir may hold both


def test_device_frontend_batched_equals_alone(model_dir, tmp_path):
    data = make_speakers(tmp_path, num_spk=2, num_utt=4, min_sec=0.3, max_sec=6.0, seed=5)
    emb = SpkflowEmbedder(model_dir, fbank_on="device")
    prep = emb.preparer(data)
    waves = [prep(u) for u in permuted((data / "utt2spk").read_text().split()[::2])]
    assert max(map(len, waves)) > 3 * min(map(len, waves))  # lots of padding
    batched = emb.embed(waves)
    alone = np.concatenate([emb.embed([w]) for w in waves])
    worst = float(np.abs(l2(batched) - l2(alone)).max())
    within("device fbank batched vs alone (L2-normalised)", worst, 1e-4)  # measured <= 6.7e-7
    # frames() counts 10 ms frames of the fbank a waveform will give, as for features
    feats = SpkflowEmbedder(model_dir).preparer(data)
    utt = (data / "utt2spk").read_text().split()[0]
    assert emb.frames(prep(utt)) >= SpkflowEmbedder(model_dir).frames(feats(utt))


def test_short_utterance_is_named_or_skipped(model_dir, tmp_path):
    data = make_speakers(tmp_path, num_spk=1, num_utt=3, seed=8)
    victim = (data / "utt2spk").read_text().split()[2]
    wav = dict(line.split(" ", 1) for line in (data / "wav.scp").read_text().splitlines())
    short = tmp_path / "short.wav"
    import soundfile as sf

    sf.write(short, np.zeros(300, dtype=np.float32), 16000)  # 300 samples: less than one 400-sample frame
    wav[victim] = str(short)
    (data / "wav.scp").write_text("".join(f"{u} {w}\n" for u, w in sorted(wav.items())))
    emb = SpkflowEmbedder(model_dir, fbank_on="device")
    utts = (data / "utt2spk").read_text().split()[::2]
    with pytest.raises(UtteranceError, match=rf"{victim}.*shorter than one frame"):
        run_job(emb, data, utts, tmp_path / "fail", num_workers=0, progress=False)
    summary = run_job(emb, data, utts, tmp_path / "skip", num_workers=0, skip_bad=True, progress=False)
    assert list(summary.bad) == [victim] and sorted(vectors(tmp_path / "skip")) == sorted(set(utts) - {victim})


def test_a_float_file_with_a_nan_is_named_or_skipped_with_workers(model_dir, tmp_path):
    """The workers hand over the reader's samples unchecked again (``_WavePreparer.finite``): the
    reader's check is what names the utterance."""
    import soundfile as sf

    data = make_speakers(tmp_path, num_spk=1, num_utt=4, seed=9)
    utts = (data / "utt2spk").read_text().split()[::2]
    victim = utts[1]
    wav = dict(line.split(" ", 1) for line in (data / "wav.scp").read_text().splitlines())
    x, rate = sf.read(wav[victim].strip(), dtype="float32")
    x[len(x) // 2] = np.nan
    sf.write(tmp_path / "nan.wav", x, rate, subtype="FLOAT")
    wav[victim] = str(tmp_path / "nan.wav")
    (data / "wav.scp").write_text("".join(f"{u} {w.strip()}\n" for u, w in sorted(wav.items())))
    emb = SpkflowEmbedder(model_dir, fbank_on="device")
    with pytest.raises(UtteranceError, match=rf"{victim}.*nan.wav.*NaN or infinite samples"):
        run_job(emb, data, utts, tmp_path / "fail", num_workers=2, progress=False)
    summary = run_job(emb, data, utts, tmp_path / "skip", num_workers=2, skip_bad=True, progress=False)
    assert list(summary.bad) == [victim] and "NaN or infinite samples" in summary.bad[victim]
    assert sorted(vectors(tmp_path / "skip")) == sorted(set(utts) - {victim})


def test_batches_read_in_place_embed_as_whole_reads_and_a_short_flac_is_named_or_skipped(
    model_dir, tmp_path, monkeypatch
):
    """With workers, 16-bit files are read straight into the batch (spkflow.data.audio.OpenSamples);
    without, whole: the same vectors bit for bit.  A FLAC shorter than its header, found only as it
    is read in place, is read again whole, which names it (or skips it with skip_bad)."""
    import soundfile as sf

    data = make_speakers(tmp_path, num_spk=2, num_utt=4, seed=10)
    utts = (data / "utt2spk").read_text().split()[::2]
    victim = utts[3]
    wav = dict(line.split(" ", 1) for line in (data / "wav.scp").read_text().splitlines())
    flac = tmp_path / "cut.flac"
    sf.write(flac, sf.read(wav[victim].strip(), dtype="float32")[0], 16000, subtype="PCM_16", format="FLAC")
    flac.write_bytes(flac.read_bytes()[: flac.stat().st_size * 6 // 10])
    wav[victim] = str(flac)
    (data / "wav.scp").write_text("".join(f"{u} {w.strip()}\n" for u, w in sorted(wav.items())))
    emb = SpkflowEmbedder(model_dir, fbank_on="device")
    prepare = emb.preparer(data)
    assert all(prepare.open(u) is not None for u in utts)  # every one planned in place, the victim too
    kw = dict(batch_size=3, max_frames=1200, progress=False, skip_bad=True)
    read_into, log = OpenSamples.read_into, tmp_path / "in_place.log"

    def logged(self, out):  # the workers are forked: they run this too, and say so in the log
        with open(log, "a") as f:
            f.write(f"{self.utt}\n")
        return read_into(self, out)

    monkeypatch.setattr(OpenSamples, "read_into", logged)
    in_place = run_job(emb, data, utts, tmp_path / "in_place", num_workers=2, **kw)
    assert sorted(log.read_text().split()) == sorted(utts)  # each read in place once (the victim failed so)
    whole = run_job(emb, data, utts, tmp_path / "whole", num_workers=0, **kw)
    assert list(in_place.bad) == list(whole.bad) == [victim] and "cannot read audio" in in_place.bad[victim]
    a, b = vectors(tmp_path / "in_place"), vectors(tmp_path / "whole")
    assert sorted(a) == sorted(b) == sorted(set(utts) - {victim})
    assert all(np.array_equal(a[u], b[u]) for u in a)
    with pytest.raises(UtteranceError, match=rf"{victim}.*cut.flac.*cannot read audio"):
        run_job(emb, data, utts, tmp_path / "fail", num_workers=2, progress=False)
    # a worker keeps at most _OPEN_FILES files open for a batch; the rest of it is read whole
    log.unlink()
    monkeypatch.setattr(loader_module, "_OPEN_FILES", 1)
    run_job(emb, data, utts, tmp_path / "one_open", num_workers=2, **kw)
    batches = len(log.read_text().split())  # one read in place per batch
    assert 2 <= batches < len(utts)
    assert vectors(tmp_path / "one_open").keys() == a.keys()
    assert all(np.array_equal(vectors(tmp_path / "one_open")[u], a[u]) for u in a)


def test_fbank_on_choices(model_dir, tmp_path):
    assert SpkflowEmbedder(model_dir, fbank_on="auto").fbank_on == "workers"  # auto: device on CUDA only
    with pytest.raises(ValueError, match="--fbank-on must be one of auto, workers, device"):
        SpkflowEmbedder(model_dir, fbank_on="gpu")
    with pytest.raises(ValueError, match="--feats-dir reads stage 2's features"):
        SpkflowEmbedder(model_dir, feats_dir=tmp_path, fbank_on="device")
    with pytest.raises(ValueError, match="is for --toolkit spkflow"):
        open_embedder(tmp_path, "espnet", fbank_on="device")


@pytest.mark.slow
def test_script_fbank_on_device_equals_workers(model_dir, tmp_path):
    """extract_embeddings.sh --fbank-on device through run.pl, two jobs, against --fbank-on workers."""
    data = make_mixed_data(tmp_path, num_spk=2, num_utt=3, seed=6)
    out = {}
    for where in ("workers", "device"):
        args = ["--nj", "2", "--fbank-on", where, "--model-dir", str(model_dir), str(data), str(tmp_path / where)]
        p = subprocess.run(["bash", str(SCRIPT), *args], env=env(), capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        log = "".join(f.read_text() for f in sorted((tmp_path / where / "log").glob("extract_*.log")))
        assert f"fbank {'on the device' if where == 'device' else 'in the loader workers'}" in log
        out[where] = dict(kaldiio.load_scp(str(tmp_path / where / "xvector.scp")))
    assert list(out["workers"]) == list(out["device"]) and len(out["device"]) == 6
    worst = max(float(np.abs(l2(v) - l2(out["device"][u])).max()) for u, v in out["workers"].items())
    within("extract_embeddings.sh --fbank-on device vs workers (L2-normalised)", worst, 2e-5)  # measured <= 5.5e-7
    bad = subprocess.run(
        ["bash", str(SCRIPT), "--fbank-on", "gpu", "--model-dir", str(model_dir), str(data), str(tmp_path / "x")],
        env=env(),
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1 and "--fbank-on must be auto, workers or device" in bad.stderr
