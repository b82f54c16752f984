"""Byte-for-byte parity with Kaldi's utils/ on inputs that exercise its quirks.

The expected outputs below were worked out from what each Kaldi pipeline does
(``sort -k1,1 -u`` keeps the first of duplicate keys, awk rewrites segments with
single spaces, ``apply_map.pl`` re-joins fields with single spaces, the
``--per-spk`` awk leaves a trailing space, copy_data_dir.sh moves the utt2uniq it
just wrote to .backup, ...) and were checked against Kaldi's own scripts
(kaldi-asr/kaldi egs/wsj/s5/utils, 2025-07) while developing.  Kaldi is not needed
to run these.

``test_live_parity_with_kaldi`` additionally runs Kaldi's scripts and ours on
random data dirs when ``KALDI_UTILS`` points at Kaldi's ``egs/wsj/s5/utils``
(skipped otherwise; CI has no Kaldi).
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest

from helpers.datadirs import read_all, sh, write_dir
from helpers.paths import ROOT

UTILS = ROOT / "utils"


def test_fix_data_dir_matches_kaldi(tmp_path: Path) -> None:
    d = write_dir(
        tmp_path / "d",
        utt2spk="b-2 b\na-1 a\nb-1 b\na-2 a\nc-1 c\nb-1 b\n",
        segments="b-1 r2 0 1.5\na-1 r1\t0  2.25\na-2 r1 2.25 4\nb-2 r2 1.5 3\nc-1 r3 0 1\n",
        wav_scp="r1 /w/r1.wav\nr2 sox /w/r2.flac -t wav - |\nr3 /w/r3.wav\nr9 /w/unused.wav\n",
        utt2dur="a-1 2.25\na-2 1.75\nb-1 1.5\nb-2 0\nc-1 1\n",
        spk2gender="a f\nb m\n",
        vad_scp="b-1 [ 1 ]\nb-1 [ 2 ]\na-1 [ 3 ]\n",
    )
    p = sh(f"{UTILS}/fix_data_dir.sh {d}")
    assert p.returncode == 0, p.stderr
    assert "fix_data_dir.sh: kept 3 utterances out of 4" in p.stdout
    assert read_all(d) == {
        "segments": "a-1 r1 0 2.25\na-2 r1 2.25 4\nb-1 r2 0 1.5\n",
        "spk2gender": "a f\nb m\n",
        "spk2utt": "a a-1 a-2\nb b-1\n",
        "utt2dur": "a-1 2.25\na-2 1.75\nb-1 1.5\n",
        "utt2spk": "a-1 a\na-2 a\nb-1 b\n",
        "vad.scp": "a-1 [ 3 ]\nb-1 [ 1 ]\n",
        "wav.scp": "r1 /w/r1.wav\nr2 sox /w/r2.flac -t wav - |\n",
    }


def test_copy_data_dir_matches_kaldi(tmp_path: Path) -> None:
    src = write_dir(
        tmp_path / "src",
        utt2spk="a-1 a\na-2 a\nb-1 b\n",
        spk2utt="a a-1 a-2\nb b-1\n",
        wav_scp="a-1\tsox  /w/a1.flac -t wav - |\na-2 /w/a2.wav\nb-1 /w/b1.wav   \n",
        spk2gender="a m\nb f\n",
        utt2dur="a-1 2.5\na-2 1\nb-1 3\n",
    )
    p = sh(f"{UTILS}/copy_data_dir.sh --utt-prefix v1- --spk-prefix v1- {src} {tmp_path}/dst")
    assert p.returncode == 0, p.stderr
    assert read_all(tmp_path / "dst") == {
        "spk2gender": "v1-a m\nv1-b f\n",
        "spk2utt": "v1-a v1-a-1 v1-a-2\nv1-b v1-b-1\n",
        "utt2dur": "v1-a-1 2.5\nv1-a-2 1\nv1-b-1 3\n",
        "utt2spk": "v1-a-1 v1-a\nv1-a-2 v1-a\nv1-b-1 v1-b\n",
        "wav.scp": "v1-a-1 sox /w/a1.flac -t wav - |\nv1-a-2 /w/a2.wav\nv1-b-1 /w/b1.wav\n",
    }
    assert read_all(tmp_path / "dst" / ".backup") == {"utt2uniq": "v1-a-1 a-1\nv1-a-2 a-2\nv1-b-1 b-1\n"}


def subset_src(d: Path) -> Path:
    counts = {"s0": 2, "s1": 5, "s2": 5, "s3": 2, "s4": 3}
    u2s = [(f"{s}-u{i}", s) for s, n in counts.items() for i in range(n)]
    return write_dir(
        d,
        utt2spk="".join(f"{u} {s}\n" for u, s in u2s),
        spk2utt="".join(f"{s} " + " ".join(f"{s}-u{i}" for i in range(n)) + "\n" for s, n in counts.items()),
        wav_scp="".join(f"{u} /w/{u}.wav\n" for u, _ in u2s),
    )


def test_subset_per_spk_and_speakers_match_kaldi(tmp_path: Path) -> None:
    src = subset_src(tmp_path / "src")
    assert sh(f"{UTILS}/subset_data_dir.sh --per-spk {src} 3 {tmp_path}/per").returncode == 0
    assert (tmp_path / "per" / "spk2utt").read_text() == (
        "s0 s0-u0 s0-u1 \ns1 s1-u0 s1-u1 s1-u2 \ns2 s2-u0 s2-u1 s2-u2 \ns3 s3-u0 s3-u1 \ns4 s4-u0 s4-u1 s4-u2 \n"
    )
    # --speakers: Kaldi's shuffle_list.pl with srand(0) puts s0, s2 first (2 + 5 >= 7 utterances).
    assert sh(f"{UTILS}/subset_data_dir.sh --speakers {src} 7 {tmp_path}/spk").returncode == 0
    assert (tmp_path / "spk" / "spk2utt").read_text() == "s0 s0-u0 s0-u1\ns2 s2-u0 s2-u1 s2-u2 s2-u3 s2-u4\n"
    # default: subset_scp.pl's even spread over utt2spk
    assert sh(f"{UTILS}/subset_data_dir.sh {src} 5 {tmp_path}/spread").returncode == 0
    assert (tmp_path / "spread" / "utt2spk").read_text() == "s1-u1 s1\ns2-u0 s2\ns2-u4 s2\ns3-u1 s3\ns4-u2 s4\n"


def test_combine_data_matches_kaldi(tmp_path: Path) -> None:
    x = write_dir(
        tmp_path / "x",
        utt2spk="a-1 a\na-2 a\n",
        spk2utt="a a-1 a-2\n",
        segments="a-1 r1 0 1.5\na-2 r1 1.5 3\n",
        wav_scp="r1 /w/r1.wav\n",
        utt2uniq="a-1 orig1\n",
        utt2dur="a-1 1.5\na-2 1.5\n",
    )
    y = write_dir(
        tmp_path / "y",
        utt2spk="b-1 b\nb-2 b\n",
        spk2utt="b b-1 b-2\n",
        wav_scp="b-1 /w/b1.wav\nb-2 /w/b2.wav\n",
        utt2dur="b-1 2.5\nb-2 0.75\n",
    )
    p = sh(f"{UTILS}/combine_data.sh {tmp_path}/xy {y} {x}")
    assert p.returncode == 0, p.stderr
    assert read_all(tmp_path / "xy") == {
        "segments": "a-1 r1 0 1.5\na-2 r1 1.5 3\nb-1 b-1 0 2.5\nb-2 b-2 0 0.75\n",  # made from y's utt2dur
        "spk2utt": "a a-1 a-2\nb b-1 b-2\n",
        "utt2dur": "a-1 1.5\na-2 1.5\nb-1 2.5\nb-2 0.75\n",
        "utt2spk": "a-1 a\na-2 a\nb-1 b\nb-2 b\n",
        "utt2uniq": "a-1 orig1\nb-1 b-1\nb-2 b-2\n",
        "wav.scp": "b-1 /w/b1.wav\nb-2 /w/b2.wav\nr1 /w/r1.wav\n",
    }


# --------------------------------------------------------------------------- live comparison (dev only)

KALDI_UTILS = os.environ.get("KALDI_UTILS", "")


def random_dir(d: Path, rng: random.Random) -> None:
    spks = sorted({"S" + "".join(rng.choice("abAB01_.") for _ in range(rng.randint(1, 3))) for _ in range(4)})
    u2s = sorted((f"{s}-{rng.randint(0, 99)}", s) for s in spks for _ in range(rng.randint(1, 4)))
    u2s = list(dict(u2s).items())
    utts = [u for u, _ in u2s]

    seps = [" ", " ", "\t"]

    def table(keys, val, drop=0.15):
        lines = [f"{k}{rng.choice(seps)}{val(k)}\n" for k in keys if rng.random() > drop]
        if rng.random() < 0.3:
            rng.shuffle(lines)
        if lines and rng.random() < 0.2:
            lines.append(lines[0])
        return "".join(lines)

    files = {"utt2spk": table(utts, dict(u2s).get, 0)}
    files["wav_scp"] = table(utts, lambda u: f"/w/{u}.wav")
    if rng.random() < 0.5:
        files["utt2dur"] = table(utts, lambda u: rng.choice(["1.5", "2", "0"]))
    if rng.random() < 0.4:
        files["spk2gender"] = table(spks, lambda s: rng.choice("mf"))
    if rng.random() < 0.3:
        files["feats_scp"] = table(utts, lambda u: f"/f.ark:{len(u)}")
    write_dir(d, **files)


@pytest.mark.skipif(
    not (KALDI_UTILS and Path(KALDI_UTILS, "fix_data_dir.sh").is_file()),
    reason="set KALDI_UTILS to Kaldi's egs/wsj/s5/utils to compare against Kaldi itself",
)
def test_live_parity_with_kaldi(tmp_path: Path) -> None:
    kenv = tmp_path / "kenv"
    kenv.mkdir()
    (kenv / "utils").symlink_to(KALDI_UTILS)
    (kenv / "path.sh").write_text("")
    env = {"PATH": f"{kenv}/utils:{os.environ['PATH']}"}
    rng = random.Random(0)
    for i in range(30):
        k, o = tmp_path / f"k{i}", tmp_path / f"o{i}"
        random_dir(k, rng)
        shutil.copytree(k, o)
        pk = sh(f"utils/fix_data_dir.sh {k}", cwd=kenv, env=env)
        po = sh(f"{UTILS}/fix_data_dir.sh {o}")
        assert (pk.returncode == 0) == (po.returncode == 0), (pk.stdout, po.stderr)
        if pk.returncode == 0:
            assert read_all(k) == read_all(o)
        for flags in ("--no-text --no-feats", "--no-text"):
            vk = sh(f"utils/validate_data_dir.sh {flags} {k}", cwd=kenv, env=env)
            vo = sh(f"{UTILS}/validate_data_dir.sh {flags} {k}")
            assert ("Successfully" in vk.stdout) == (vo.returncode == 0), (vk.stdout, vo.stderr)
