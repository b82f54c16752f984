"""The VoxCeleb recipe (egs/voxceleb/spk1) on a miniature tree laid out like the official downloads.

The tree is made here from real speech of the shared corpora (found through db.sh):
speechocean762's train speakers become VoxCeleb2 dev speakers (m4a made with the same
imageio-ffmpeg binary the recipe decodes with), its test speakers VoxCeleb1 speakers (16 kHz wav);
the trial lists are in the official format (``1 id10270/<video>/00001.wav id10270/<video>/00002.wav``).
MUSAN's speech part holds LibriSpeech speech, its noise and music parts synthetic noise and tones;
RIRS_NOISES holds synthetic exponentially decaying impulse responses.  Nothing is mocked.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from helpers.corpora import assert_valid
from helpers.paths import ROOT, db_var
from helpers.recipes import mirror_recipe
from spkflow.corpora.voxceleb import m4a_duration
from spkflow.data.datadir import DataDir
from spkflow.data.tables import read_kv

RECIPE = Path("egs") / "voxceleb" / "spk1"
SEGMENT_S = 2.0  # seconds of each source utterance kept (tiny, so the whole recipe runs in ~2 min)
# VoxCeleb video ids are 11 characters of [A-Za-z0-9_-], so some start with '-'
VIDEOS = ("x6uYqmx31kE", "-5uTnaMr_zI", "8jEAjG6SegY")


def ffmpeg() -> str:
    import imageio_ffmpeg

    return imageio_ffmpeg.get_ffmpeg_exe()


def _source_utts(so762: Path, split: str) -> dict[str, list[Path]]:
    """speechocean762 speaker -> audio files of one split (sorted)."""
    wav, u2s = read_kv(so762 / split / "wav.scp"), read_kv(so762 / split / "utt2spk")
    out: dict[str, list[Path]] = {}
    for utt in sorted(wav):
        p = so762 / wav[utt]
        if not p.is_file():
            p = p.with_suffix(".flac")
        out.setdefault(u2s[utt], []).append(p)
    return out


def _clip(src: Path, dst: Path) -> None:
    x, rate = sf.read(src, dtype="float32")
    dst.parent.mkdir(parents=True, exist_ok=True)
    sf.write(dst, x[: int(SEGMENT_S * rate)], rate, subtype="PCM_16")


def _official_list(path: Path, utts: list[tuple[str, str]], n_non: int, seed: int) -> int:
    """Write ``<1|0> a.wav b.wav`` lines: every target pair of ``utts`` ((spk, rel path)) and
    ``n_non`` non-target pairs; returns the number of lines."""
    rng = np.random.default_rng(seed)
    lines = []
    for i, (sa, a) in enumerate(utts):
        for sb, b in utts[i + 1 :]:
            if sa == sb:
                lines.append(f"1 {a} {b}")
    non = [(a, b) for i, (sa, a) in enumerate(utts) for sb, b in utts[i + 1 :] if sa != sb]
    for k in rng.choice(len(non), size=min(n_non, len(non)), replace=False):
        lines.append(f"0 {non[k][0]} {non[k][1]}")
    path.write_text("\n".join(lines) + "\n")
    return len(lines)


def make_vox_tree(root: Path, so762: Path, libri: Path) -> dict[str, Path]:
    """VoxCeleb1 (wav + 3 lists), VoxCeleb2 dev (m4a), MUSAN, RIRS_NOISES under ``root``."""
    exe = ffmpeg()
    vox1, vox2 = root / "voxceleb1", root / "voxceleb2"
    train, test = _source_utts(so762, "train"), _source_utts(so762, "test")
    # VoxCeleb2 dev: 10 speakers x 3 utterances, two videos each, AAC in m4a
    tmp_wav = root / "tmp.wav"
    for n, spk in enumerate(sorted(train)[:10]):
        for k, src in enumerate(train[spk][:3]):
            _clip(src, tmp_wav)
            dst = vox2 / "dev" / "aac" / f"id{n + 12:05d}" / VIDEOS[k % 2] / f"{k + 1:05d}.m4a"
            dst.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [exe, "-nostdin", "-v", "error", "-y", "-i", str(tmp_wav), "-c:a", "aac", "-b:a", "48k", str(dst)],
                check=True,
            )
    tmp_wav.unlink()
    # VoxCeleb1: 6 test speakers (id10270...) and 4 dev speakers (id10001...), 3 utterances each
    spks = sorted(test)
    vox1_utts: list[tuple[str, str]] = []
    for n, spk in enumerate(spks[:10]):
        vid = f"id{10270 + n}" if n < 6 else f"id{10001 + n - 6}"
        for k, src in enumerate(test[spk][:3]):
            rel = f"{vid}/{VIDEOS[k % 3]}/{k + 1:05d}.wav"
            _clip(src, vox1 / "wav" / rel)
            vox1_utts.append((vid, rel))
    test_part = [u for u in vox1_utts if u[0] >= "id10270"]
    _official_list(vox1 / "veri_test2.txt", test_part, 18, seed=1)
    _official_list(vox1 / "list_test_all2.txt", vox1_utts, 30, seed=2)
    _official_list(vox1 / "list_test_hard2.txt", vox1_utts, 20, seed=3)
    # MUSAN: noise (coloured noise), music (tones), speech (LibriSpeech), as released
    musan = root / "musan"
    rng = np.random.default_rng(0)
    rate = 16000
    for src, n in (("free-sound", 2), ("sound-bible", 1)):
        for i in range(n):
            noise = np.cumsum(rng.standard_normal(3 * rate)).astype(np.float32)
            noise = 0.3 * (noise - noise.mean()) / (np.abs(noise).max() + 1e-9)
            p = musan / "noise" / src / f"noise-{src}-{i:04d}.wav"
            p.parent.mkdir(parents=True, exist_ok=True)
            sf.write(p, noise, rate, subtype="PCM_16")
    t = np.arange(4 * rate) / rate
    p = musan / "music" / "fma" / "music-fma-0000.wav"
    p.parent.mkdir(parents=True, exist_ok=True)
    sf.write(p, (0.2 * np.sin(2 * np.pi * 440 * t) * np.sin(2 * np.pi * 0.5 * t)).astype(np.float32), rate)
    flacs = sorted(libri.rglob("*.flac"))[:2]
    for i, src in enumerate(flacs):
        _clip(src, musan / "speech" / "librivox" / f"speech-librivox-{i:04d}.wav")
    for part in ("noise", "music", "speech"):
        (musan / part / "README").write_text(f"MUSAN {part}\n")
    # RIRS_NOISES: exponentially decaying noise bursts as simulated room impulse responses
    rirs = root / "RIRS_NOISES"
    for size, rt60 in (("small", 0.2), ("medium", 0.4), ("large", 0.7)):
        for room in (1, 2):
            for i in range(2):
                n = int(rt60 * rate)
                h = rng.standard_normal(n) * np.exp(-6.9 * np.arange(n) / n)  # -60 dB at rt60
                h[0] = 1.0
                p = rirs / "simulated_rirs" / f"{size}room" / f"Room{room:03d}" / f"Room{room:03d}-{i + 1:05d}.wav"
                p.parent.mkdir(parents=True, exist_ok=True)
                sf.write(p, (0.9 * h / np.abs(h).max()).astype(np.float32), rate, subtype="PCM_16")
    return {"VOXCELEB1": vox1, "VOXCELEB2": vox2, "MUSAN": musan, "RIRS_NOISES": rirs}


@pytest.fixture(scope="module")
def vox_tree(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    so762, libri = Path(db_var("SPEECHOCEAN762")), Path(db_var("LIBRISPEECH"))
    if not (so762 / "train" / "wav.scp").is_file() or not libri.is_dir():
        pytest.skip(f"real speech not found at SPEECHOCEAN762={so762} / LIBRISPEECH={libri} (db.sh)")
    return make_vox_tree(tmp_path_factory.mktemp("vox"), so762, libri)


def run_recipe(recipe: Path, env_extra: dict[str, Path], *args: str, timeout: float = 600):
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update({k: str(v) for k, v in env_extra.items()})
    return subprocess.run(["./run.sh", *args], cwd=recipe, capture_output=True, text=True, timeout=timeout, env=env)


def prepare(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "spkflow.bin.prepare_corpus", *args], capture_output=True, text=True, env=env
    )


def n_lines(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip())


# --------------------------------------------------------------------------- the whole recipe


def test_smoke_recipe_runs_every_stage(tmp_path: Path, vox_tree: dict[str, Path]) -> None:
    recipe = mirror_recipe(tmp_path, RECIPE)
    r = run_recipe(
        recipe,
        vox_tree,
        *("--train_config", "conf/train_smoke.yaml", "--num_spk", "8", "--num_utt", "2", "--num_epochs", "2"),
        *("--nj", "2", "--ngpu", "0", "--gpu_inference", "false", "--cohort_size", "5", "--qmf_trials", "60"),
    )
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-6000:]
    data = recipe / "data"
    for name in (
        "vox2_dev",
        "vox1",
        "vox1_o",
        "vox1_e",
        "vox1_h",
        "musan_noise",
        "musan_music",
        "musan_speech",
        "rirs",
    ):
        assert_valid(data / name)
    # VoxCeleb2: every m4a behind an ffmpeg pipe; trained on from its audio, so stage 2 made no features of it
    wav = read_kv(data / "vox2_dev" / "wav.scp")
    assert len(wav) == 30 and all(Path(v.split()[0]).samefile(ffmpeg()) and v.endswith("|") for v in wav.values())
    assert len(DataDir(data / "vox2_dev").spks()) == 10
    assert not (recipe / "dump" / "fbank" / "vox2_dev").exists()
    assert "No features of vox2_dev: conf/train_smoke.yaml trains on its audio" in out
    assert (recipe / "dump" / "fbank" / "vox1_o" / "feats.scp").is_file()  # validation reads the test set's arks
    # utterance ids: speaker-prefixed, '/' -> '-', video ids starting with '-' kept
    assert "id10271--5uTnaMr_zI-00002" in read_kv(data / "vox1" / "utt2spk")
    assert len(DataDir(data / "vox1").utts()) == 30
    # trials: one line per list line, in list order, converted
    for name, lst in (
        ("vox1_o", "veri_test2.txt"),
        ("vox1_e", "list_test_all2.txt"),
        ("vox1_h", "list_test_hard2.txt"),
    ):
        src = (vox_tree["VOXCELEB1"] / lst).read_text().splitlines()
        trials = (data / name / "trials").read_text().splitlines()
        assert len(trials) == len(src)
        lab, a, b = src[0].split()
        conv = [x.replace(".wav", "").replace("/", "-") for x in (a, b)]
        assert trials[0] == f"{conv[0]} {conv[1]} {'target' if lab == '1' else 'nontarget'}"
        named = {x.replace(".wav", "").replace("/", "-") for line in src for x in line.split()[1:]}
        assert set(DataDir(data / name).utts()) == named
        ev = recipe / "exp" / "spk_train_smoke" / "eval" / name
        m = json.loads((ev / "metrics.json").read_text())
        assert 0.0 <= m["eer"] <= 100.0 and m["n_target"] + m["n_nontarget"] == len(src)
        # QMF: calibrated scores beside the raw ones, their figures in metrics.json
        q = m["qmf"]
        assert q["measures"] == ["duration", "magnitude", "imposter"] and 0.0 <= q["eer"] <= 100.0 and q["cllr"] > 0
        assert q["n_target"] + q["n_nontarget"] == len(src) and "act_dcf_p0.01" in q
        calibrated = (ev / "scores.qmf").read_text().splitlines()
        assert [x.split()[:2] for x in calibrated] == [x.split()[:2] for x in (ev / "scores").read_text().splitlines()]
    # augmentation sources: one utterance per file
    assert len(read_kv(data / "rirs" / "wav.scp")) == 12 and len(read_kv(data / "musan_noise" / "wav.scp")) == 3
    # scale facts before the feature work
    facts = out.index("scale: ")
    assert facts < out.index("Stage 2: fbank") + 2000 and facts < out.index("make_fbank")
    assert "float32 arks" in out and "compressed" in out and "free at" in out
    assert "Successfully finished" in out
    # the QMF: fitted on trials of the training set (its JSON names them), not on a test list
    qmf = json.loads((recipe / "exp" / "spk_train_smoke" / "qmf" / "qmf.json").read_text())
    assert "drawn from data/vox2_dev/utt2spk" in qmf["fitted_on"] and len(qmf["weights"]) == 7
    assert "QMF (duration, magnitude, imposter) fitted on" in out
    # the rate follows the global batch (train_smoke: 0.0005 at 8 utterances; 8 x 2 on one process)
    train_log = (recipe / "exp" / "spk_train_smoke" / "train.log").read_text()
    assert "global batch 16 (1 rank(s) x 16 utterances); peak lr 0.001 = optim.lr 0.0005 x 16 / 8" in train_log
    assert re.search(r"step 1 batch 1/1 loss \S+ lr 0\.001 grad_norm \S+", train_log), train_log[-3000:]
    # margin warm-up (train_smoke: 0 -> 0.2 over epoch 1), logged per epoch
    hist = json.loads((recipe / "exp" / "spk_train_smoke" / "history.json").read_text())["history"]
    assert hist[0]["margin"] < 0.1 and hist[1]["margin"] == pytest.approx(0.2)  # epoch 1 ramps (1 step here)
    # waveform augmentation (train_smoke: raw path, MUSAN + RIRs of stage 1) counted per epoch in train.log
    lines = [
        x for x in (recipe / "exp" / "spk_train_smoke" / "train.log").read_text().splitlines() if "augment: epoch" in x
    ]
    assert len(lines) == 2, lines  # one line per epoch
    totals = {"reverb": 0, "noise": 0}
    for line in lines:
        crops = re.search(r"(\d+) crops: ", line)
        assert crops and int(crops.group(1)) == 16, line  # 8 speakers x 2 utterances, one batch per epoch
        for op in totals:
            totals[op] += int(re.search(rf"\b{op} (\d+)", line).group(1))
        kinds = re.search(r"noise \d+ \(([^)]*)\)", line)
        assert kinds is None or set(re.findall(r"(\w+) \d+", kinds.group(1))) <= {"noise", "music", "speech"}, line
    assert totals["reverb"] > 0 and totals["noise"] > 0, lines
    # large-margin fine-tuning: stage 4 again, initialised from the model just trained
    r = run_recipe(
        recipe,
        vox_tree,
        *("--stage", "3", "--stop_stage", "4", "--train_config", "conf/train_smoke_lm.yaml"),
        *("--num_spk", "8", "--num_utt", "2", "--num_epochs", "1", "--nj", "2", "--ngpu", "0"),
    )
    assert r.returncode == 0, (r.stdout + r.stderr)[-6000:]
    lm = recipe / "exp" / "spk_train_smoke_lm"
    log = (lm / "train.log").read_text()
    assert "initialised from exp/spk_train_smoke/model.pth + the loss's weights of exp/spk_train_smoke/loss.pth" in log
    # speed classes kept, no crop perturbed (WeSpeaker's large-margin fine-tuning); reverb or noise still on
    line = next(x for x in log.splitlines() if "augment: epoch 1" in x)
    assert "16 crops: speed 0," in line and not re.search(r"reverb 0, noise 0 ", line), line
    assert json.loads((lm / "history.json").read_text())["history"][0]["margin"] == pytest.approx(0.5)
    assert (lm / "model.pth").is_file()


# --------------------------------------------------------------------------- lists naming missing files


def test_list_naming_missing_file_errors_or_skips(tmp_path: Path, vox_tree: dict[str, Path]) -> None:
    vox1 = tmp_path / "voxceleb1"
    vox1.mkdir()
    (vox1 / "wav").symlink_to(vox_tree["VOXCELEB1"] / "wav")
    for lst in ("list_test_all2.txt", "list_test_hard2.txt"):
        shutil.copy(vox_tree["VOXCELEB1"] / lst, vox1 / lst)
    lines = (vox_tree["VOXCELEB1"] / "veri_test2.txt").read_text().splitlines()
    lines.insert(3, "1 id10270/x6uYqmx31kE/00009.wav id10270/x6uYqmx31kE/00001.wav")
    (vox1 / "veri_test2.txt").write_text("\n".join(lines) + "\n")
    recipe = mirror_recipe(tmp_path, RECIPE)
    env = {**vox_tree, "VOXCELEB1": vox1}
    r = run_recipe(recipe, env, "--stage", "1", "--stop_stage", "1")
    out = r.stdout + r.stderr
    assert r.returncode != 0
    assert f"{vox1}/veri_test2.txt:4: names id10270/x6uYqmx31kE/00009.wav" in out
    assert not (recipe / "data" / "vox1_o").exists()
    r = run_recipe(recipe, env, "--stage", "1", "--stop_stage", "1", "--local_data_opts", "--missing skip --vox12 true")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert "skipped 1 of " + str(len(lines)) + " trials" in out
    assert n_lines(recipe / "data" / "vox1_o" / "trials") == len(lines) - 1
    # vox12: VoxCeleb2 dev + VoxCeleb1 dev speakers (the 4 outside id10270-id10309)
    assert_valid(recipe / "data" / "vox12")
    assert len(DataDir(recipe / "data" / "vox12").spks()) == 10 + 4


# --------------------------------------------------------------------------- bad input


def test_corrupt_m4a_names_the_file_and_writes_nothing(tmp_path: Path, vox_tree: dict[str, Path]) -> None:
    vox2 = tmp_path / "voxceleb2"
    shutil.copytree(vox_tree["VOXCELEB2"], vox2)
    bad = sorted((vox2 / "dev" / "aac").rglob("*.m4a"))[4]
    bad.write_bytes(b"\x00\x00\x00\x18ftypM4A " + os.urandom(200))  # an MP4 signature, then garbage
    r = prepare("voxceleb2", str(vox2), str(tmp_path / "data" / "vox2_dev"))
    assert r.returncode == 1 and f"{bad}: corrupt m4a" in r.stderr
    assert not (tmp_path / "data").exists()  # not even the parent: nothing half-written


def test_missing_musan_folder_is_named(tmp_path: Path, vox_tree: dict[str, Path]) -> None:
    musan = tmp_path / "musan"
    shutil.copytree(vox_tree["MUSAN"], musan)
    shutil.rmtree(musan / "music")
    r = prepare("musan", "--part", "music", str(musan), str(tmp_path / "data" / "musan_music"))
    assert r.returncode == 1 and "MUSAN" in r.stderr and str(musan) in r.stderr and "music" in r.stderr
    assert not (tmp_path / "data" / "musan_music").exists()


def test_trial_list_in_wrong_format_names_file_and_line(tmp_path: Path, vox_tree: dict[str, Path]) -> None:
    lst = tmp_path / "veri_test2.txt"
    good = (vox_tree["VOXCELEB1"] / "veri_test2.txt").read_text().splitlines()
    # the Kaldi form (enroll test target) instead of the official (label enroll test)
    lst.write_text("\n".join(good[:2] + ["id10270-x6uYqmx31kE-00001 id10271-x6uYqmx31kE-00001 nontarget"]) + "\n")
    r = prepare("voxceleb1", "--trial-list", str(lst), str(vox_tree["VOXCELEB1"]), str(tmp_path / "vox1_o"))
    assert r.returncode == 1 and f"{lst}:3: expected '<1|0> idXXXXX/<video>/<clip>.wav" in r.stderr
    assert not (tmp_path / "vox1_o").exists()


def test_m4a_duration_from_header_matches_decoded_audio(vox_tree: dict[str, Path], tmp_path: Path) -> None:
    m4a = sorted((vox_tree["VOXCELEB2"] / "dev" / "aac").rglob("*.m4a"))[0]
    wav = tmp_path / "x.wav"
    subprocess.run([ffmpeg(), "-nostdin", "-v", "error", "-i", str(m4a), str(wav)], check=True)
    assert abs(m4a_duration(m4a) - sf.info(str(wav)).duration) < 0.1


def test_scale_facts_figures_and_disk_warning(tmp_path: Path) -> None:
    """Hours from utt2dur, arks by arithmetic (10 ms frames x 80 dims x 4 or 2 bytes + VAD),
    and a warning when the features would not fit on the disk."""
    d = tmp_path / "data" / "big"
    d.mkdir(parents=True)
    (d / "utt2spk").write_text("a-1 a\na-2 a\n")
    (d / "utt2dur").write_text("a-1 3600\na-2 3600\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "spkflow.bin.scale_facts", "--out-dir", str(tmp_path / "dump"), str(d)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    # 2 h = 720,000 frames: float 720000 * (80*4 + 4) = 233.3 MB, compressed 720000 * (80*2 + 4) = 118.1 MB
    assert "2.00 h of audio" in r.stderr and "~233.3 MB float32 arks, ~118.1 MB compressed" in r.stderr
    assert "Warning" not in r.stderr and "WARNING" not in r.stderr
    (d / "utt2dur").write_text("a-1 3600000000\na-2 3600\n")  # a million hours: no disk holds that
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "WARNING: scale: the features need" in r.stderr


def test_voxceleb2_converted_copies_are_read_directly(tmp_path: Path, vox_tree: dict[str, Path]) -> None:
    """A tree converted once to FLAC (README's one-liner) gives plain paths; an utterance stored
    both as m4a and FLAC is an error naming both files."""
    vox2 = tmp_path / "voxceleb2"
    shutil.copytree(vox_tree["VOXCELEB2"], vox2)
    m4a = sorted((vox2 / "dev" / "aac").rglob("*.m4a"))[0]
    flac = m4a.with_suffix(".flac")
    subprocess.run(
        [ffmpeg(), "-nostdin", "-v", "error", "-i", str(m4a), "-ac", "1", "-ar", "16000", str(flac)], check=True
    )
    r = prepare("voxceleb2", str(vox2), str(tmp_path / "both"))
    assert r.returncode == 1 and str(flac) in r.stderr and str(m4a) in r.stderr
    m4a.unlink()
    r = prepare("voxceleb2", str(vox2), str(tmp_path / "vox2_dev"))
    assert r.returncode == 0, r.stderr
    wav = read_kv(tmp_path / "vox2_dev" / "wav.scp")
    utt = "-".join(flac.relative_to(vox2 / "dev" / "aac").with_suffix("").parts)
    assert wav[utt] == str(flac) and sum(v.endswith("|") for v in wav.values()) == len(wav) - 1
    assert abs(float(read_kv(tmp_path / "vox2_dev" / "utt2dur")[utt]) - sf.info(str(flac)).duration) < 1e-3
