"""Waveform augmentation (spkflow.augment.wave) and its sources (spkflow.augment.sources): real audio
made here, real data dirs, real FLAC files, pyroomacoustics RIRs."""

from __future__ import annotations

import collections
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from helpers.audio import make_speakers, write_data_dir
from helpers.paths import ROOT
from spkflow.augment.sources import coloured_noise, simulate_rirs
from spkflow.augment.wave import (
    AudioBank,
    DecodedAudioCache,
    WaveAugment,
    add_at_snr,
    band_limit,
    normalize_augment_config,
    reverberate,
    speed_perturb,
)
from spkflow.core.checks import ConfigError
from spkflow.train.config import load_train_config, normalize_train_config

SR = 16000


def power(x: np.ndarray) -> float:
    return float(np.mean(np.asarray(x, dtype=np.float64) ** 2))


def tone(freq: float, seconds: float = 1.0, amp: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def band_power(x: np.ndarray, lo: float, hi: float) -> float:
    spec = np.abs(np.fft.rfft(x)) ** 2
    f = np.fft.rfftfreq(len(x), 1 / SR)
    return float(spec[(f >= lo) & (f < hi)].sum())


# --------------------------------------------------------------------------- operations


@pytest.mark.parametrize("snr", [0.0, 7.5, 20.0])
def test_add_at_snr_hits_the_snr(snr):
    rng = np.random.default_rng(0)
    x = tone(440)
    n = rng.standard_normal(len(x)).astype(np.float32)
    y = add_at_snr(x, n, snr)
    assert 10 * np.log10(power(x) / power(y - x)) == pytest.approx(snr, abs=1e-3)
    assert add_at_snr(x, np.zeros_like(x), snr) is x  # silent noise: unchanged


def test_reverb_keeps_direct_path_alignment_and_power():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(8000) * np.hanning(8000)).astype(np.float32)
    delay = 37
    h = np.zeros(2000)  # direct path at 37, then (below) a decaying tail
    h[delay] = 1.0  # a pure delay: the output must be the input itself
    np.testing.assert_allclose(reverberate(x, h), x, atol=1e-5)
    m = len(h) - delay - 400
    h[delay + 400 :] = 0.3 * rng.standard_normal(m) * np.exp(-np.arange(m) / 300)  # a decaying tail
    y = reverberate(x, h)
    assert len(y) == len(x) and y.dtype == np.float32
    assert power(y) == pytest.approx(power(x), rel=1e-4)
    lags = np.arange(-100, 101)
    xc = [np.dot(x[max(0, -k) : len(x) - max(0, k)], y[max(0, k) : len(y) - max(0, -k)]) for k in lags]
    assert lags[int(np.argmax(xc))] == 0  # aligned on the direct path, not shifted by the delay


def test_speed_perturb_changes_length_and_pitch():
    x = tone(1000, 1.0)
    for f in (0.9, 1.1):
        y = speed_perturb(x, f)
        assert len(y) == pytest.approx(len(x) / f, abs=2)
        spec = np.abs(np.fft.rfft(y[1000:-1000] * np.hanning(len(y) - 2000)))
        peak = np.fft.rfftfreq(len(y) - 2000, 1 / SR)[int(np.argmax(spec))]
        assert peak == pytest.approx(1000 * f, abs=3)
    assert speed_perturb(x, 1.0) is x


@pytest.mark.parametrize("mode", ["telephone", "bandpass"])
def test_band_limit_removes_the_high_band(mode):
    x = tone(1000) + tone(6000)
    y = band_limit(x, SR, mode)
    assert len(y) == len(x) and y.dtype == np.float32
    assert band_power(y, 5000, 8000) < 1e-4 * band_power(x, 5000, 8000)
    assert band_power(y, 900, 1100) > 0.8 * band_power(x, 900, 1100)
    if mode == "bandpass":
        z = band_limit(tone(100), SR, mode)
        assert band_power(z, 50, 150) < 0.05 * band_power(tone(100), 50, 150)


def test_coloured_noise_slopes():
    rng = np.random.default_rng(2)
    slopes = {}
    for colour in ("white", "pink", "brown"):
        x = coloured_noise(colour, 4 * SR, rng)
        assert power(x) == pytest.approx(0.01, rel=1e-3)
        lo, hi = band_power(x, 200, 400), band_power(x, 3200, 6400)  # power per octave-ish band
        slopes[colour] = 10 * np.log10(hi / 16 / (lo / 1))  # dB per 16x the bandwidth
    # white: power density flat (hi band 16x wider); pink: 1/f; brown: 1/f^2
    assert slopes["white"] == pytest.approx(0, abs=1.0)
    assert slopes["pink"] == pytest.approx(-12, abs=1.5)
    assert slopes["brown"] == pytest.approx(-24, abs=2.0)


def test_simulated_rirs_are_reproducible_and_decay():
    a = list(simulate_rirs(2, seed=3, rt60=(0.2, 0.3), room_xy=(3, 4), room_z=(2.5, 3)))
    b = list(simulate_rirs(2, seed=3, rt60=(0.2, 0.3), room_xy=(3, 4), room_z=(2.5, 3)))
    assert [k for k, _, _ in a] == ["rir00000", "rir00001"]
    for (_, h, info), (_, g, _) in zip(a, b, strict=True):
        np.testing.assert_array_equal(h, g)
        assert int(np.argmax(np.abs(h))) <= 32  # 2 ms pre-delay kept at most
        assert 0.2 <= info["rt60"] <= 0.3
        e = np.cumsum(h[::-1].astype(np.float64) ** 2)[::-1]  # Schroeder decay
        t20 = np.flatnonzero(10 * np.log10(e / e[0]) < -20)[0] / SR
        assert 0.03 < 3 * t20 < 0.6  # the decay is the order of the asked RT60


# --------------------------------------------------------------------------- configuration


def test_config_defaults_and_errors(tmp_path):
    c = normalize_augment_config(
        {"noise": {"prob": 0.5, "data_dirs": {"noise": "n", "music": "m", "babble": "data/train"}}}
    )
    assert c["noise"]["snr"] == {"noise": [0.0, 15.0], "music": [5.0, 15.0], "babble": [13.0, 20.0]}
    assert c["noise"]["num_sources"] == {"noise": [1, 1], "music": [1, 1], "babble": [3, 7]}
    assert c["reverb"]["prob"] == 0.0 and c["speed"]["factors"] is None
    bad = [
        ({"nois": {}}, "augment.nois"),
        ({"noise": {"prob": 0.5, "data_dir": "x"}}, "augment.noise.data_dir"),
        ({"noise": {"prob": 1.5, "data_dirs": {"noise": "n"}}}, "augment.noise.prob"),
        ({"noise": {"prob": 0.5}}, "augment.noise.data_dirs"),
        ({"noise": {"prob": 0.5, "data_dirs": {"hum": "h"}}}, "augment.noise.snr.hum"),
        ({"noise": {"data_dirs": {"noise": "n"}, "snr": {"noise": [10, 5]}}}, "augment.noise.snr.noise"),
        ({"noise": {"data_dirs": {"noise": "n"}, "snr": {"music": [1, 5]}}}, "augment.noise.snr.music"),
        ({"reverb": {"prob": 0.3}}, "augment.reverb.data_dir"),
        ({"band": {"prob": 0.1, "mode": "radio"}}, "augment.band.mode"),
        ({"gain": {"db": [3]}}, "augment.gain.db"),
        ({"speed": {"factors": [0.9, 3.0]}}, "augment.speed.factors[1] must be in [0.5, 2.0], got 3.0"),
        ({"speed": {"factors": []}}, "augment.speed.factors must be null or a list"),
        (
            {"noise": {"data_dirs": {"babble": "b"}, "num_sources": {"babble": [0, 3]}}},
            "num_sources.babble[0] must be >= 1",
        ),
        ({"noise": {"data_dirs": {"babble": "b"}, "num_sources": {"babble": [2, 3.5]}}}, "must be an integer, got 3.5"),
        ({"gain": {"prob": True}}, "augment.gain.prob must be a number, got True"),
    ]
    for cfg, key in bad:
        with pytest.raises(ConfigError, match=r"^conf/x\.yaml: .*" + re.escape(key)):
            normalize_augment_config(cfg, "conf/x.yaml")
    # through the training config: file name in the message, feats_type raw required
    path = tmp_path / "train.yaml"
    path.write_text("model: {name: ecapa_tdnn}\nloss: {name: ge2e}\naugment: {gain: {prob: 0.5, dbs: [1, 2]}}\n")
    with pytest.raises(ConfigError, match=rf"{path}.*augment\.gain\.dbs"):
        load_train_config(path)
    base = {"model": {"name": "ecapa_tdnn"}, "loss": {"name": "ge2e"}}
    with pytest.raises(ConfigError, match="feats_type: raw"):
        normalize_train_config({**base, "augment": {"gain": {"prob": 0.5}}})
    with pytest.raises(ConfigError, match="speed_perturb"):
        normalize_train_config(
            {
                **base,
                "frontend": {"feats_type": "raw"},
                "augment": {"speed": {"factors": [0.9, 1.1]}},
                "train": {"speed_perturb": [0.9, 1.1]},
            }
        )
    ok = normalize_train_config({**base, "frontend": {"feats_type": "raw"}, "augment": {"gain": {"prob": 0.5}}})
    assert ok["augment"]["gain"] == {"prob": 0.5, "db": [-6.0, 6.0]}
    assert normalize_train_config(base)["frontend"]["feats_type"] == "ark"


# --------------------------------------------------------------------------- sources and pipeline


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("src")
    speech = make_speakers(root / "speech", num_spk=4, num_utt=2, fmt="flac")
    rng = np.random.default_rng(5)
    wav, u2s = {}, {}
    (root / "noise").mkdir()
    for colour in ("white", "pink"):
        p = root / "noise" / f"{colour}.flac"
        sf.write(p, coloured_noise(colour, 20 * SR, rng), SR, subtype="PCM_16")  # long: read by seeking
        wav[colour], u2s[colour] = str(p), colour
    noise = write_data_dir(root / "noise_dir", wav, u2s)
    wav, u2s = {}, {}
    (root / "rir").mkdir()
    for key, h, _ in simulate_rirs(2, seed=0, rt60=(0.2, 0.3), room_xy=(3, 4), room_z=(2.5, 3)):
        p = root / "rir" / f"{key}.flac"
        sf.write(p, h, SR, subtype="PCM_16")
        wav[key], u2s[key] = str(p), key
    rirs = write_data_dir(root / "rir_dir", wav, u2s)
    return {"speech": speech, "noise": noise, "rirs": rirs}


def test_audio_bank_segments_and_speaker_exclusion(sources):
    bank = AudioBank(sources["speech"], SR)
    rng = np.random.default_rng(0)
    for _ in range(40):
        i = bank.pick(rng, exclude_speaker="spk001")
        assert bank.speaker[i] != "spk001"
    noise = AudioBank(sources["noise"], SR)
    whole = {k: noise.reader.read(k) for k in noise.keys}
    for seed in range(6):
        seg = noise.segment(np.random.default_rng(seed), 3000)
        assert len(seg) == 3000 and seg.dtype == np.float32
        # a seeked read returns samples of one of the files, at some offset
        assert any(
            np.flatnonzero(np.isclose(w[:-3000], seg[0]) & np.isclose(w[1:-2999], seg[1])).size for w in whole.values()
        )
    short = AudioBank(sources["rirs"], SR)
    assert len(short.segment(np.random.default_rng(0), 40000)) == 40000  # tiled when shorter


def test_a_piece_does_not_depend_on_the_cache(sources, monkeypatch):
    """A short source (decoded whole and kept while the cache has room) gives the same pieces,
    drawn alike, when the cache cannot keep it: then only the piece is read from the file.
    Mutant checked by hand: drawing the piece's offset over ``frames - n`` gives other pieces."""
    import spkflow.augment.wave as wave

    n = 4000
    in_memory = AudioBank(sources["speech"], SR)
    lengths = [in_memory.reader.file_span(k).frames for k in in_memory.keys]
    assert max(lengths) <= 8 * n < 4 * min(lengths)  # short files, a piece a quarter of one or less
    monkeypatch.setattr(wave, "AUDIO_CACHE", DecodedAudioCache(64))
    kept = [in_memory.segment(np.random.default_rng([7, s]), n) for s in range(12)]
    c = wave.AUDIO_CACHE  # the premise: decoded whole and kept, and found there again
    assert c.hits + c.misses == len(kept) and c.hits > 0 and len(c._items) == c.misses
    monkeypatch.setattr(wave, "AUDIO_CACHE", DecodedAudioCache(0))
    pieces = AudioBank(sources["speech"], SR)
    monkeypatch.setattr(pieces.reader, "read", lambda utt: pytest.fail(f"{utt} decoded whole"))
    for s, want in enumerate(kept):
        np.testing.assert_array_equal(pieces.segment(np.random.default_rng([7, s]), n), want)
    assert wave.AUDIO_CACHE.misses == 0


def test_wave_augment_deterministic_and_each_stage_fires(sources):
    cfg = normalize_augment_config(
        {
            "reverb": {"prob": 1.0, "data_dir": str(sources["rirs"])},
            "noise": {"prob": 1.0, "data_dirs": {"noise": str(sources["noise"]), "babble": str(sources["speech"])}},
            "band": {"prob": 1.0},
            "gain": {"prob": 1.0, "db": [-3, -3]},
        }
    )
    aug = WaveAugment(cfg, SR)
    x = AudioBank(sources["speech"], SR).whole(0)
    a = aug(x, np.random.default_rng([1, 2]), speaker="spk000")
    b = aug(x, np.random.default_rng([1, 2]), speaker="spk000")
    c = aug(x, np.random.default_rng([1, 3]), speaker="spk000")
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c) and len(a) == len(x)
    assert band_power(a, 4100, 8000) < 1e-3 * band_power(a, 0, 4000)  # telephone band applied last but gain
    off = WaveAugment(normalize_augment_config({}), SR)
    np.testing.assert_array_equal(off(x, np.random.default_rng(0)), x)
    # turning one stage off leaves the others' draws alone: gain only vs gain + (never firing) band
    g1 = WaveAugment(normalize_augment_config({"gain": {"prob": 0.5}}), SR)
    g2 = WaveAugment(normalize_augment_config({"gain": {"prob": 0.5}, "band": {"prob": 0.0}}), SR)
    for s in range(5):
        np.testing.assert_array_equal(g1(x, np.random.default_rng(s)), g2(x, np.random.default_rng(s)))


def test_make_rirs_and_make_noise_cli(tmp_path):
    from spkflow.bin import make_noise, make_rirs

    assert (
        make_rirs.main(
            ["--num", "2", "--seed", "1", "--rt60", "0.2", "0.25", "--room-xy", "3", "4", "--out", str(tmp_path / "r")]
        )
        == 0
    )
    assert make_noise.main(["--num", "3", "--seconds", "0.5", "--out", str(tmp_path / "n")]) == 0
    for d, n in (("r", 2), ("n", 3)):
        lines = (tmp_path / d / "wav.scp").read_text().splitlines()
        assert len(lines) == n and all(Path(line.split()[1]).is_file() for line in lines)
        assert len((tmp_path / d / "utt2dur").read_text().splitlines()) == n
        bank = AudioBank(tmp_path / d, SR)  # readable as an augmentation source
        assert len(bank) == n
    assert "rt60=" in (tmp_path / "r" / "info.txt").read_text()
    with pytest.raises(SystemExit):
        make_rirs.main(["--num", "0", "--out", str(tmp_path / "x")])


def test_results_md_lists_peer_rows_on_the_same_trials(tmp_path, monkeypatch):
    """A pretrained peer scored on the same trials (exp/peer_*/eval/<set>, as
    local/peer_resemblyzer.py writes it) appears as a row of every experiment's RESULTS.md."""
    import kaldiio

    from spkflow.score.eval_report import evaluate_set, write_results_md

    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    utts = [f"s{i}-u{j}" for i in range(4) for j in range(3)]
    Path("data/test").mkdir(parents=True)
    Path("data/test/trials").write_text(
        "".join(
            f"{a} {b} {'target' if a[:2] == b[:2] else 'nontarget'}\n"
            for i, a in enumerate(utts)
            for b in utts[i + 1 :]
        )
    )
    for exp in ("exp/spk_ours", "exp/peer_other"):
        Path(exp).mkdir(parents=True)
        with kaldiio.WriteHelper(f"ark,scp:{exp}/x.ark,{exp}/x.scp") as w:
            for u in utts:
                w(u, rng.standard_normal(8).astype(np.float32))
        evaluate_set("data/test/trials", f"{exp}/x.scp", f"{exp}/eval/test", model_tag=Path(exp).name, plots=False)
    text = Path(write_results_md("exp/spk_ours")).read_text()
    assert "| spk_ours |" in text and "| peer_other | pretrained (peer) |" in text
    # a peer scored on other trials is not listed
    Path("data/test/trials2").write_text(Path("data/test/trials").read_text())
    evaluate_set("data/test/trials2", "exp/peer_other/x.scp", "exp/peer_other/eval/test", plots=False)
    assert "peer_other" not in Path(write_results_md("exp/spk_ours")).read_text()


def test_peer_speaker_means_are_a_cohort_like_stage_5s(tmp_path):
    """local/peer_resemblyzer.py's cohort for --score-norm/--score-center: the mean of each
    speaker's utterance vectors (what stage 5's spk_xvector.scp holds), read back by
    spkflow.score.trial_scoring.read_cohort; a --peer-dir not named peer_* is refused (RESULTS.md would not
    find it)."""
    import importlib.util
    import subprocess
    import sys

    import kaldiio

    from spkflow.score.trial_scoring import read_cohort

    script = ROOT / "egs/speechocean762/spk1/local/peer_resemblyzer.py"
    spec = importlib.util.spec_from_file_location("peer_resemblyzer", script)
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    rng = np.random.default_rng(0)
    vecs = {f"s{i}-u{j}": rng.standard_normal(4).astype(np.float32) for i in range(3) for j in range(2 + i)}
    (tmp_path / "data").mkdir()
    (tmp_path / "data/utt2spk").write_text("".join(f"{u} {u.split('-')[0]}\n" for u in sorted(vecs)))
    with kaldiio.WriteHelper(f"ark,scp:{tmp_path}/x.ark,{tmp_path}/x.scp") as w:
        for u in sorted(vecs):
            w(u, vecs[u])
    scp = peer.speaker_means(str(tmp_path / "data"), str(tmp_path / "x.scp"), str(tmp_path))
    means = dict(kaldiio.load_scp(scp))
    assert sorted(means) == ["s0", "s1", "s2"]
    for spk, m in means.items():
        np.testing.assert_allclose(m, np.mean([v for u, v in vecs.items() if u.startswith(spk + "-")], 0), rtol=1e-6)
    assert read_cohort(scp).shape == (3, 4)
    # --backend wccn: stage 6's backend fitted on the same utterance vectors and utt2spk
    from spkflow.score.backend import Backend, fit_backend

    path = peer.fit_peer_backend("wccn", str(tmp_path / "data"), str(tmp_path / "x.scp"), str(tmp_path / "peer_x"))
    got = Backend.load(path)
    want = fit_backend("wccn", np.stack([vecs[u] for u in sorted(vecs)]), [u.split("-")[0] for u in sorted(vecs)])
    assert path.endswith("peer_x/backend/wccn.npz") and np.allclose(got.proj, want.proj, atol=1e-6)
    bad = subprocess.run([sys.executable, str(script), "--peer-dir", "exp/resemblyzer"], capture_output=True, text=True)
    assert bad.returncode == 2 and "must be named peer_*" in bad.stderr
    both = [sys.executable, str(script), "--eval-mean", "--score-center"]
    bad = subprocess.run(both, capture_output=True, text=True)
    assert bad.returncode == 2 and "not both" in bad.stderr


def test_reverb_noise_exclusive_and_kind_draw_by_files(sources):
    """reverb_noise exclusive (WeSpeaker's rule): never both, each at its own probability from
    one draw; independent (the default, ESPnet's): both happen.  kind_draw files: kinds in
    proportion to their files (speech has 8, noise 2: 80% speech)."""
    x = AudioBank(sources["speech"], SR).whole(0)
    dirs = {"noise": str(sources["noise"]), "speech": str(sources["speech"])}

    def rates(cfg: dict, n: int = 400) -> collections.Counter:
        aug = WaveAugment(normalize_augment_config(cfg), SR)
        counts: collections.Counter = collections.Counter()
        for s in range(n):
            done: collections.Counter = collections.Counter()
            aug(x[:4000], np.random.default_rng([9, s]), speaker="spk000", counts=done)
            counts.update(done)
            counts["both"] += done["reverb"] and done["noise"]
        return counts

    base = {"reverb": {"prob": 0.3, "data_dir": str(sources["rirs"])}, "noise": {"prob": 0.3, "data_dirs": dirs}}
    one = rates({**base, "reverb_noise": "exclusive", "noise": {**base["noise"], "kind_draw": "files"}})
    assert one["both"] == 0 and 90 <= one["reverb"] <= 150 and 90 <= one["noise"] <= 150  # 120 expected each
    assert one["noise.speech"] > 2.5 * one["noise.noise"]  # 8 : 2 files
    indep = rates(base)
    assert indep["both"] > 10 and abs(indep["noise.speech"] - indep["noise.noise"]) < 0.4 * indep["noise"]
    with pytest.raises(ConfigError, match=r"augment\.reverb_noise: exclusive needs reverb\.prob \+ noise\.prob <= 1"):
        normalize_augment_config(
            {
                **base,
                "reverb_noise": "exclusive",
                "reverb": {"prob": 0.7, "data_dir": "r"},
                "noise": {**base["noise"], "prob": 0.5},
            }
        )
    with pytest.raises(ConfigError, match=r"augment\.speed\.perturb: false keeps the classes"):
        normalize_augment_config({"speed": {"factors": [0.9, 1.1], "perturb": False}})
    with pytest.raises(ConfigError, match=r"augment\.noise\.kind_draw must be uniform \| files"):
        normalize_augment_config({"noise": {"kind_draw": "weighted"}})


def test_decoded_audio_cache_keeps_exact_samples_within_its_bound(tmp_path):
    """16-bit files are kept as int16 and come back as the reader's float samples, bit for bit; the
    cache holds at most its bound, least recently used out first; at 0 it keeps nothing."""
    from spkflow.data.audio import AudioReader

    data = make_speakers(tmp_path, num_spk=2, num_utt=2, min_sec=1.0, max_sec=1.0)
    reader = AudioReader(data, sample_rate=SR)
    keys = reader.keys()
    want = {k: reader.read(k) for k in keys}
    one = want[keys[0]].size * 2  # bytes of one utterance as int16
    cache = DecodedAudioCache(2.5 * one / 2**20)  # room for two
    for k in keys + keys[-2:]:
        assert np.array_equal(cache.read(reader, k), want[k]), k
    assert (cache.misses, cache.hits) == (len(keys), 2)
    assert cache._bytes <= cache.max_bytes and len(cache._items) == 2
    assert np.array_equal(cache.read(reader, keys[0]), want[keys[0]]) and cache.misses == len(keys) + 1  # evicted
    off = DecodedAudioCache(0)
    for k in keys + keys:
        assert np.array_equal(off.read(reader, k), want[k])
    assert off.hits == 0 and off.misses == 2 * len(keys) and not off._items
