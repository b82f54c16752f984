"""The data-dir scripts in utils/ carry stage 2's per-utterance CMVN files.

``cmvn_utt.scp`` and ``cmvn_utt_voiced.scp`` (utterance-keyed Kaldi CMVN stats, written by
``scripts/feats/make_fbank.sh``) must follow Kaldi's rules for ``vad.scp``
(:data:`spkflow.data.tables.VAD_LIKE_FILES`): filtered to the kept utterances but never a reason to
drop one (fix), subset / combined / copied along, utterance ids renamed by copy's
``--utt-prefix``, and validated like vad.scp (sorted, unique, the utterances of utt2spk).
The stats are real kaldiio arks; the last test runs make_fbank.sh itself on synthetic audio.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import kaldiio
import numpy as np
import pytest

from helpers.audio import make_speakers
from helpers.paths import ROOT
from spkflow.data.tables import UTT_FILES, VAD_LIKE_FILES, read_kv

UTILS = ROOT / "utils"
CMVN_FILES = ("cmvn_utt.scp", "cmvn_utt_voiced.scp")


def sh(cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(
        ["bash", "-c", cmd], capture_output=True, text=True, env=dict(os.environ, LC_ALL="C", OMP_NUM_THREADS="1")
    )
    if check and p.returncode != 0:
        raise AssertionError(f"{cmd} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return p


def stats_for(utt: str, voiced: bool) -> np.ndarray:
    """A compute-cmvn-stats style 2 x (F+1) matrix, distinct per utterance and file."""
    seed = sum(map(ord, utt)) * 2 + voiced
    x = np.random.default_rng(seed).normal(size=(2, 5))
    x[0, -1], x[1, -1] = 40 + seed % 17, 0.0  # frame count, 0
    return x


def write_cmvn(d: Path, utts: list[str], name: str = "cmvn_utt.scp") -> None:
    """Write real stats arks + scp for ``utts`` (scp lines in the given order)."""
    voiced = name == "cmvn_utt_voiced.scp"
    ark = d / (name.replace(".scp", "") + ".ark")
    scp_lines: list[str] = []
    with kaldiio.WriteHelper(f"ark,scp:{ark},{d}/tmp.scp") as w:
        for u in dict.fromkeys(utts):
            w(u, stats_for(u, voiced))
    offsets = read_kv(d / "tmp.scp")
    (d / "tmp.scp").unlink()
    for u in utts:
        scp_lines.append(f"{u} {offsets[u]}\n")
    (d / name).write_text("".join(scp_lines))


def data_dir(
    d: Path, spk_utts: dict[str, list[str]], cmvn_utts: list[str] | None = None, files: tuple[str, ...] = CMVN_FILES
) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    utts = sorted(u for us in spk_utts.values() for u in us)
    u2s = {u: s for s, us in spk_utts.items() for u in us}
    (d / "utt2spk").write_text("".join(f"{u} {u2s[u]}\n" for u in utts))
    (d / "spk2utt").write_text("".join(f"{s} {' '.join(sorted(us))}\n" for s, us in sorted(spk_utts.items())))
    (d / "wav.scp").write_text("".join(f"{u} /w/{u}.wav\n" for u in utts))
    for name in files:
        write_cmvn(d, utts if cmvn_utts is None else cmvn_utts, name)
    return d


def loaded(path: Path) -> dict[str, np.ndarray]:
    return dict(kaldiio.load_scp(str(path)).items())


def assert_stats(d: Path, utts: list[str], rename: str = "") -> None:
    """Every cmvn file of ``d`` lists exactly ``utts`` (sorted) with the source's matrices."""
    for name in CMVN_FILES:
        keys = list(read_kv(d / name))
        assert keys == sorted(rename + u for u in utts), name
        got = loaded(d / name)
        for u in utts:
            np.testing.assert_array_equal(got[rename + u], stats_for(u, name == "cmvn_utt_voiced.scp"))


SPK = {"a": ["a-1", "a-2", "a-3"], "b": ["b-1", "b-2"], "c": ["c-1"]}
ALL = sorted(u for us in SPK.values() for u in us)


def test_one_shared_definition() -> None:
    assert VAD_LIKE_FILES == ("vad.scp", *CMVN_FILES)
    assert set(VAD_LIKE_FILES) <= set(UTT_FILES)


# --------------------------------------------------------------------------- fix_data_dir.sh


def test_fix_filters_sorts_and_dedups_like_vad_scp(tmp_path: Path) -> None:
    """Same unsorted / duplicated / extra-key content in vad.scp and both cmvn files: the three
    come out identical, filtered to the utterances that feats.scp keeps."""
    d = data_dir(tmp_path / "d", SPK, files=())
    (d / "feats.scp").write_text("".join(f"{u} /f.ark:{i}\n" for i, u in enumerate(ALL) if u != "b-2"))
    messy = "c-1 x:3\na-2 x:2\nzz-9 x:9\na-1 x:1\na-2 x:22\nb-2 x:5\n"  # a-3 and b-1 lack stats
    for name in VAD_LIKE_FILES:
        (d / name).write_text(messy)
    p = sh(f"{UTILS}/fix_data_dir.sh {d}")
    assert "kept 5 utterances out of 6" in p.stdout  # only feats.scp removed one (b-2)
    for name in CMVN_FILES:
        assert f"file {d}/{name} is not in sorted order or not unique, sorting it" in p.stdout
        assert (d / name).read_text() == (d / "vad.scp").read_text() == "a-1 x:1\na-2 x:2\nc-1 x:3\n"
        assert (d / ".backup" / name).read_text() == messy  # original bytes kept
    assert list(read_kv(d / "utt2spk")) == ["a-1", "a-2", "a-3", "b-1", "c-1"]  # a-3 / b-1 stay


def test_fix_never_drops_an_utterance_for_missing_stats(tmp_path: Path) -> None:
    d = data_dir(tmp_path / "d", SPK, cmvn_utts=["a-1", "b-1", "b-2"])
    p = sh(f"{UTILS}/fix_data_dir.sh {d}")
    assert "kept all 6 utterances" in p.stdout
    assert list(read_kv(d / "utt2spk")) == ALL
    assert not (d / ".backup" / "cmvn_utt.scp").exists()  # unchanged: not rewritten


def test_fix_drops_stats_of_removed_utterances_and_keeps_them_loadable(tmp_path: Path) -> None:
    d = data_dir(tmp_path / "d", SPK)
    (d / "wav.scp").write_text("".join(f"{u} /w/{u}.wav\n" for u in ALL if u not in ("a-2", "c-1")))
    p = sh(f"{UTILS}/fix_data_dir.sh --utt-extra-files cmvn_utt.scp {d}")  # naming it again is harmless
    assert "kept 4 utterances out of 6" in p.stdout
    assert_stats(d, ["a-1", "a-3", "b-1", "b-2"])
    sh(f"{UTILS}/validate_data_dir.sh --no-text --no-feats {d}")


# --------------------------------------------------------------------------- subset_data_dir.sh


@pytest.mark.parametrize(
    "how,kept",
    [
        ("--first {src} 2", ["a-1", "a-2"]),
        ("--last {src} 3", ["b-1", "b-2", "c-1"]),
        ("--utt-list {lst} {src}", ["a-3", "c-1"]),
        ("--spk-list {spk} {src}", ["b-1", "b-2"]),
        ("--per-spk {src} 1", ["a-1", "b-1", "c-1"]),
    ],
)
def test_subset_carries_the_stats(tmp_path: Path, how: str, kept: list[str]) -> None:
    src = data_dir(tmp_path / "src", SPK)
    (tmp_path / "lst").write_text("a-3 x\nc-1 y\n")
    (tmp_path / "spk").write_text("b\n")
    dst = tmp_path / "dst"
    cmd = how.format(src=src, lst=tmp_path / "lst", spk=tmp_path / "spk")
    sh(f"{UTILS}/subset_data_dir.sh {cmd} {dst}")
    assert list(read_kv(dst / "utt2spk")) == kept
    assert_stats(dst, kept)
    sh(f"{UTILS}/validate_data_dir.sh --no-text --no-feats {dst}")


# --------------------------------------------------------------------------- combine_data.sh


def test_combine_concatenates_the_stats(tmp_path: Path) -> None:
    one = data_dir(tmp_path / "one", {"b": SPK["b"], "c": SPK["c"]})
    two = data_dir(tmp_path / "two", {"a": SPK["a"]})
    p = sh(f"{UTILS}/combine_data.sh {tmp_path}/all {one} {two}")
    for name in CMVN_FILES:
        assert f"combined {name}" in p.stdout
    assert_stats(tmp_path / "all", ALL)  # sorted across sources, arks still readable
    sh(f"{UTILS}/validate_data_dir.sh --no-text --no-feats {tmp_path}/all")


def test_combine_skips_stats_missing_somewhere(tmp_path: Path) -> None:
    one = data_dir(tmp_path / "one", {"b": SPK["b"]})
    two = data_dir(tmp_path / "two", {"a": SPK["a"]}, files=("cmvn_utt.scp",))
    p = sh(f"{UTILS}/combine_data.sh {tmp_path}/all {one} {two}")
    assert "combined cmvn_utt.scp" in p.stdout
    assert "**not combining cmvn_utt_voiced.scp as it does not exist everywhere**" in p.stdout
    assert list(read_kv(tmp_path / "all" / "cmvn_utt.scp")) == ["a-1", "a-2", "a-3", "b-1", "b-2"]
    assert not (tmp_path / "all" / "cmvn_utt_voiced.scp").exists()


# --------------------------------------------------------------------------- copy_data_dir.sh


def test_copy_renames_utterances_in_the_stats(tmp_path: Path) -> None:
    src = data_dir(tmp_path / "src", SPK)
    (src / "vad.scp").write_text((src / "cmvn_utt.scp").read_text())
    p = sh(f"{UTILS}/copy_data_dir.sh --utt-prefix v1- --spk-prefix v1- {src} {tmp_path}/dst")
    assert "Successfully validated" in p.stdout  # copy_data_dir.sh validates its result
    dst = tmp_path / "dst"
    assert_stats(dst, ALL, rename="v1-")
    for name in CMVN_FILES:  # renamed exactly like vad.scp
        assert (dst / name).read_text().replace("cmvn_utt_voiced.ark", "cmvn_utt.ark") == (dst / "vad.scp").read_text()


def test_copy_moves_stale_stats_aside(tmp_path: Path) -> None:
    src = data_dir(tmp_path / "src", SPK, files=())
    dst = data_dir(tmp_path / "dst", {"z": ["z-1"]})  # stats of another data dir
    old = (dst / "cmvn_utt.scp").read_text()
    p = sh(f"{UTILS}/copy_data_dir.sh {src} {dst}")
    assert f"file cmvn_utt.scp exists in dest {dst} but not in src {src}" in p.stdout
    assert not (dst / "cmvn_utt.scp").exists() and not (dst / "cmvn_utt_voiced.scp").exists()
    assert (dst / ".backup" / "cmvn_utt.scp").read_text() == old


# --------------------------------------------------------------------------- validate_data_dir.sh


@pytest.mark.parametrize("name", CMVN_FILES)
@pytest.mark.parametrize(
    "lines,message",
    [
        ("a-1 x:1\na-3 x:3\na-2 x:2\nb-1 x\nb-2 x\nc-1 x\n", "{d}/{name}:3: not sorted"),
        ("a-1 x\na-2 x\na-2 y\na-3 x\nb-1 x\nb-2 x\nc-1 x\n", "{d}/{name}:3: duplicate key 'a-2'"),
        ("a-1 x\na-2 x\na-3 x\nb-1 x\nb-2 x\nc-1 x\nd-1 x\n", "{d}/{name}:7: utterance 'd-1' is not in utt2spk"),
        ("a-1 x\na-2 x\na-3 x\nb-1 x\nc-1 x\n", "utterance 'b-2' (utt2spk line 5) is missing from {name}"),
    ],
    ids=["unsorted", "duplicate", "unknown-utt", "missing-utt"],
)
def test_validate_checks_stats_like_vad_scp(tmp_path: Path, name: str, lines: str, message: str) -> None:
    d = data_dir(tmp_path / "d", SPK, files=())
    v = f"{UTILS}/validate_data_dir.sh --no-text --no-feats {d}"
    sh(v)
    (d / name).write_text(lines)
    p = sh(v, check=False)
    assert p.returncode == 1 and message.format(d=d, name=name) in p.stderr, p.stderr
    (d / "vad.scp").write_text(lines)  # vad.scp gets the same verdict
    (d / name).unlink()
    p = sh(v, check=False)
    assert p.returncode == 1 and message.format(d=d, name="vad.scp") in p.stderr, p.stderr


# --------------------------------------------------------------------------- real stage-2 output


def test_stage2_output_survives_subset_copy_combine(tmp_path: Path) -> None:
    """make_fbank.sh output -> subset -> copy with prefix -> combine: every stats matrix is the
    one make_fbank.sh computed for that utterance."""
    data = make_speakers(tmp_path, num_spk=2, num_utt=3, min_sec=0.3, max_sec=0.5)
    fb = tmp_path / "fbank"
    sh(f"{ROOT}/scripts/feats/make_fbank.sh --nj 1 {data} {fb}")
    ref = {name: loaded(fb / name) for name in CMVN_FILES}
    utts = list(read_kv(fb / "utt2spk"))
    assert all(list(read_kv(fb / name)) == utts for name in CMVN_FILES)
    (tmp_path / "lst").write_text(f"{utts[0]}\n{utts[4]}\n")
    sh(f"{UTILS}/subset_data_dir.sh --utt-list {tmp_path}/lst {fb} {tmp_path}/sub")
    sh(f"{UTILS}/copy_data_dir.sh --utt-prefix sp- --spk-prefix sp- {tmp_path}/sub {tmp_path}/cp")
    sh(f"{UTILS}/combine_data.sh {tmp_path}/all {fb} {tmp_path}/cp")
    sh(f"{UTILS}/validate_data_dir.sh --no-text {tmp_path}/all")
    for name in CMVN_FILES:
        got = loaded(tmp_path / "all" / name)
        assert sorted(got) == sorted([*utts, f"sp-{utts[0]}", f"sp-{utts[4]}"])
        for u, m in got.items():
            np.testing.assert_array_equal(m, ref[name][u.removeprefix("sp-")])
