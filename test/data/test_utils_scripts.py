"""The Kaldi-compatible scripts in utils/, called the way a recipe calls them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from helpers.datadirs import sh, snapshot, write_dir
from helpers.paths import ROOT

UTILS = ROOT / "utils"


# --------------------------------------------------------------------------- parse_options.sh

OPTS_SCRIPT = """#!/usr/bin/env bash
set -euo pipefail
nj=4
stop_stage=10
use_gpu=false
cmd=run.pl
name="a b"
help_message="Usage: $0 [options] <dir>  (100% kaldi)"
. {utils}/parse_options.sh
printf '%s|' "$nj" "$stop_stage" "$use_gpu" "$cmd" "$name" "$#" "$@"
"""


@pytest.fixture
def opts(tmp_path: Path) -> Path:
    p = tmp_path / "opts.sh"
    p.write_text(OPTS_SCRIPT.format(utils=UTILS))
    return p


@pytest.mark.parametrize(
    "args,expected",
    [
        ("", "4|10|false|run.pl|a b|0|"),
        ("--nj 8 x", "8|10|false|run.pl|a b|1|x|"),
        ("--nj=8 --stop-stage=3 --stop_stage 5 x y", "8|5|false|run.pl|a b|2|x|y|"),
        ("--use-gpu true --cmd 'queue.pl -l \"a b\" $X' d", "true|4|"[0:0] + '4|10|true|queue.pl -l "a b" $X|a b|1|d|'),
        ("--name '' --nj 2 -- --nj 3", "2|10|false|run.pl||2|--nj|3|"),
        ("d --nj 3", "4|10|false|run.pl|a b|3|d|--nj|3|"),
    ],
)
def test_parse_options_forms(opts: Path, args: str, expected: str) -> None:
    p = sh(f"bash {opts} {args}", check=True)
    assert p.stdout == expected


def test_parse_options_config_file_has_lower_priority(opts: Path, tmp_path: Path) -> None:
    (tmp_path / "my.conf").write_text("nj=7\nname=conf\n")
    assert sh(f"bash {opts} --config {tmp_path}/my.conf --nj 2 d", check=True).stdout == "2|10|false|run.pl|conf|1|d|"
    assert sh(f"bash {opts} --nj 2 --config={tmp_path}/my.conf d", check=True).stdout == "2|10|false|run.pl|conf|1|d|"


@pytest.mark.parametrize(
    "args,message",
    [
        ("--foo 1", "invalid option --foo"),
        ("--use-gpu yes", 'expected "true" or "false": --use-gpu yes'),
        ("--nj", "option --nj needs a value"),
        ("--cmd ''", "empty argument to --cmd option"),
        ("--config /nonexistent/x.conf", "missing config '/nonexistent/x.conf'"),
    ],
)
def test_parse_options_errors(opts: Path, args: str, message: str) -> None:
    p = sh(f"bash {opts} {args}")
    assert p.returncode == 1 and message in p.stderr


def test_parse_options_help(opts: Path) -> None:
    p = sh(f"bash {opts} --help")
    assert p.returncode == 0 and "Usage:" in p.stderr and "(100% kaldi)" in p.stderr and p.stdout == ""


# --------------------------------------------------------------------------- the Perl converters


def test_utt2spk_spk2utt_scripts(tmp_path: Path) -> None:
    (tmp_path / "utt2spk").write_text("a-1 a\nb-1 b\na-2 a\n")
    p = sh(f"{UTILS}/utt2spk_to_spk2utt.pl {tmp_path}/utt2spk", check=True)
    assert p.stdout == "a a-1 a-2\nb b-1\n"
    assert sh(f"{UTILS}/utt2spk_to_spk2utt.pl < {tmp_path}/utt2spk", check=True).stdout == p.stdout
    (tmp_path / "spk2utt").write_text(p.stdout)
    assert sh(f"{UTILS}/spk2utt_to_utt2spk.pl {tmp_path}/spk2utt", check=True).stdout == "a-1 a\na-2 a\nb-1 b\n"
    (tmp_path / "bad").write_text("a-1 a\na-2\n")
    p = sh(f"{UTILS}/utt2spk_to_spk2utt.pl {tmp_path}/bad")
    assert p.returncode != 0 and f"{tmp_path}/bad:2:" in p.stderr and p.stdout == ""
    (tmp_path / "bad").write_text("a a-1\nb\n")
    p = sh(f"{UTILS}/spk2utt_to_utt2spk.pl < {tmp_path}/bad")
    assert p.returncode != 0 and "stdin:2:" in p.stderr and p.stdout == ""


def test_filter_scp(tmp_path: Path) -> None:
    (tmp_path / "ids").write_text("b whatever\nd\n")
    (tmp_path / "scp").write_text("a 1\nb  2 x\nc 3\nd 4")  # spacing and missing newline kept
    f = f"{UTILS}/filter_scp.pl"
    assert sh(f"{f} {tmp_path}/ids {tmp_path}/scp", check=True).stdout == "b  2 x\nd 4"
    assert sh(f"{f} --exclude {tmp_path}/ids {tmp_path}/scp", check=True).stdout == "a 1\nc 3\n"
    assert sh(f"cat {tmp_path}/scp | {f} {tmp_path}/ids", check=True).stdout == "b  2 x\nd 4"
    (tmp_path / "u2s").write_text("a-1 b\na-2 c\nb-1 d\n")
    assert sh(f"{f} -f 2 {tmp_path}/ids {tmp_path}/u2s", check=True).stdout == "a-1 b\nb-1 d\n"
    assert sh(f"{f} --exclude -f 2 {tmp_path}/ids {tmp_path}/u2s", check=True).stdout == "a-2 c\n"
    (tmp_path / "ids").write_text("b\n\n")
    p = sh(f"{f} {tmp_path}/ids {tmp_path}/scp")
    assert p.returncode != 0 and f"{tmp_path}/ids:2: empty line" in p.stderr
    assert sh(f"{f}").returncode != 0 and "Usage" in sh(f"{f}").stderr


# --------------------------------------------------------------------------- split_scp.pl


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines(keepends=True)


def test_split_scp_by_lines(tmp_path: Path) -> None:
    (tmp_path / "scp").write_text("".join(f"u{i} x\n" for i in range(10)))
    outs = " ".join(str(tmp_path / f"p{j}") for j in range(1, 5))
    sh(f"{UTILS}/split_scp.pl {tmp_path}/scp {outs}", check=True)
    sizes = [len(lines_of(tmp_path / f"p{j}")) for j in range(1, 5)]
    assert sizes == [3, 3, 2, 2]  # the remainder goes to the first parts
    assert "".join((tmp_path / f"p{j}").read_text() for j in range(1, 5)) == (tmp_path / "scp").read_text()
    assert sorted(os.listdir(tmp_path)) == ["p1", "p2", "p3", "p4", "scp"]  # no temporary files left
    p = sh(f"{UTILS}/split_scp.pl -j 4 1 {tmp_path}/scp", check=True)
    assert p.stdout == (tmp_path / "p2").read_text()
    p = sh(f"{UTILS}/split_scp.pl -j 4 4 --one-based {tmp_path}/scp {tmp_path}/only", check=True)
    assert (tmp_path / "only").read_text() == (tmp_path / "p4").read_text()
    p = sh(f"{UTILS}/split_scp.pl {tmp_path}/scp " + " ".join(str(tmp_path / f"q{j}") for j in range(11)))
    assert p.returncode != 0 and "cannot split 10 lines" in p.stderr
    assert sh(f"{UTILS}/split_scp.pl -j 4 4 {tmp_path}/scp").returncode != 0


def test_split_scp_keeps_speakers_together(tmp_path: Path) -> None:
    counts = {"a": 5, "b": 1, "c": 1, "d": 4, "e": 2}
    u2s = "".join(f"{s}-{i} {s}\n" for s, n in counts.items() for i in range(n))
    (tmp_path / "utt2spk").write_text(u2s)
    outs = [tmp_path / f"p{j}" for j in range(3)]
    sh(f"{UTILS}/split_scp.pl --utt2spk={tmp_path}/utt2spk {tmp_path}/utt2spk " + " ".join(map(str, outs)), check=True)
    parts = [lines_of(p) for p in outs]
    assert "".join("".join(p) for p in parts) == u2s
    owner = {}
    for j, part in enumerate(parts):
        for line in part:
            owner.setdefault(line.split()[1], set()).add(j)
    assert all(len(v) == 1 for v in owner.values())
    # Speakers are first dealt out as a b | c d | e (6/5/2 utterances); no single move of a
    # boundary speaker narrows a neighbour gap, so Kaldi's split_scp.pl keeps 6/5/2 (checked with it).
    assert [len(p) for p in parts] == [6, 5, 2]
    p = sh(
        f"{UTILS}/split_scp.pl --utt2spk={tmp_path}/utt2spk {tmp_path}/utt2spk "
        + " ".join(str(tmp_path / f"q{j}") for j in range(6))
    )
    assert p.returncode != 0 and "5 speakers" in p.stderr
    (tmp_path / "scp").write_text("a-0 x\nzz-1 y\n")
    p = sh(f"{UTILS}/split_scp.pl --utt2spk={tmp_path}/utt2spk {tmp_path}/scp {tmp_path}/o1")
    assert p.returncode != 0 and f"{tmp_path}/scp:2: utterance 'zz-1' is not in" in p.stderr


# --------------------------------------------------------------------------- data-dir scripts


def good(d: Path) -> Path:
    return write_dir(
        d,
        utt2spk="a-1 a\na-2 a\nb-1 b\n",
        spk2utt="a a-1 a-2\nb b-1\n",
        wav_scp="a-1 /w/a1.wav\na-2 /w/a2.wav\nb-1 /w/b1.wav\n",
    )


def test_validate_data_dir_script(tmp_path: Path) -> None:
    d = good(tmp_path / "d")
    v = f"{UTILS}/validate_data_dir.sh"
    p = sh(f"{v} --no-text --no-feats {d}")
    assert p.returncode == 0 and f"Successfully validated data-directory {d}" in p.stdout
    p = sh(f"{v} {d}")  # Kaldi's default: text is required
    assert p.returncode == 1 and f"{d}/text: no such file (if this is by design, use --no-text)" in p.stderr
    (d / "utt2spk").write_text("a-1 a\nb-1 b\na-2 a\n")
    p = sh(f"{v} --no-text --no-feats {d}")
    assert p.returncode == 1 and f"{d}/utt2spk:3: not sorted" in p.stderr
    assert sh(f"{v}").returncode == 1 and "Usage" in sh(f"{v}").stderr
    assert sh(f"{v} --bogus {d}").returncode == 1
    assert sh(f"{v} {d} {d}").returncode == 1


def test_fix_data_dir_script(tmp_path: Path) -> None:
    d = write_dir(tmp_path / "d", utt2spk="b-1 b\na-1 a\na-2 a\n", wav_scp="a-1 x\nb-1 y\n")
    p = sh(f"{UTILS}/fix_data_dir.sh {d}", check=True)
    assert "fix_data_dir.sh: kept 2 utterances out of 3" in p.stdout
    assert f"old files are kept in {d}/.backup" in p.stdout
    assert (d / "spk2utt").read_text() == "a a-1\nb b-1\n"
    assert (d / ".backup" / "utt2spk").read_text() == "b-1 b\na-1 a\na-2 a\n"
    assert sh(f"{UTILS}/validate_data_dir.sh --no-text --no-feats {d}").returncode == 0
    bad = write_dir(tmp_path / "bad", utt2spk="a-1 a\na-2\n", wav_scp="a-1 x\n")
    before = snapshot(bad)
    p = sh(f"{UTILS}/fix_data_dir.sh {bad}")
    assert p.returncode == 1 and f"{bad}/utt2spk:2:" in p.stderr and snapshot(bad) == before
    assert sh(f"{UTILS}/fix_data_dir.sh").returncode == 1


def test_fix_data_dir_extra_files_option(tmp_path: Path) -> None:
    d = write_dir(tmp_path / "d", utt2spk="a-1 a\nb-1 b\n", wav_scp="b-1 y\n", utt2age="a-1 3\nb-1 4\n")
    sh(f"{UTILS}/fix_data_dir.sh --utt-extra-files utt2age {d}", check=True)
    assert (d / "utt2age").read_text() == "b-1 4\n"


def test_subset_combine_copy_scripts(tmp_path: Path) -> None:
    src = write_dir(
        tmp_path / "src",
        utt2spk="".join(f"s{s}-{u} s{s}\n" for s in range(3) for u in range(3)),
        spk2utt="".join(f"s{s} " + " ".join(f"s{s}-{u}" for u in range(3)) + "\n" for s in range(3)),
        wav_scp="".join(f"s{s}-{u} /w/{s}{u}.wav\n" for s in range(3) for u in range(3)),
    )
    p = sh(f"{UTILS}/subset_data_dir.sh --first {src} 4 {tmp_path}/first", check=True)
    assert "reducing #utt from 9 to 4" in p.stdout
    assert lines_of(tmp_path / "first" / "utt2spk") == lines_of(src / "utt2spk")[:4]
    sh(f"{UTILS}/subset_data_dir.sh --last {src} 2 {tmp_path}/last", check=True)
    assert lines_of(tmp_path / "last" / "wav.scp") == lines_of(src / "wav.scp")[-2:]
    sh(f"{UTILS}/subset_data_dir.sh --per-spk {src} 1 {tmp_path}/per", check=True)
    assert (tmp_path / "per" / "utt2spk").read_text() == "s0-0 s0\ns1-0 s1\ns2-0 s2\n"
    (tmp_path / "spks").write_text("s1\n")
    sh(f"{UTILS}/subset_data_dir.sh --spk-list {tmp_path}/spks {src} {tmp_path}/s1", check=True)
    (tmp_path / "utts").write_text("s0-1\ns2-2\n")
    sh(f"{UTILS}/subset_data_dir.sh --utt-list {tmp_path}/utts {src} {tmp_path}/u", check=True)
    assert (tmp_path / "u" / "spk2utt").read_text() == "s0 s0-1\ns2 s2-2\n"
    assert sh(f"{UTILS}/subset_data_dir.sh {src} 10 {tmp_path}/x").returncode == 1
    assert sh(f"{UTILS}/subset_data_dir.sh --bogus {src} 1 {tmp_path}/x").returncode == 1

    p = sh(f"{UTILS}/combine_data.sh {tmp_path}/all {tmp_path}/u {tmp_path}/s1", check=True)
    assert "combined wav.scp" in p.stdout
    assert (tmp_path / "all" / "spk2utt").read_text() == "s0 s0-1\ns1 s1-0 s1-1 s1-2\ns2 s2-2\n"
    assert sh(f"{UTILS}/combine_data.sh {tmp_path}/only").returncode == 1

    p = sh(f"{UTILS}/copy_data_dir.sh --utt-prefix=v1- --spk-prefix v1- {tmp_path}/all {tmp_path}/copy", check=True)
    assert "Successfully validated" in p.stdout
    assert (tmp_path / "copy" / "utt2spk").read_text().startswith("v1-s0-1 v1-s0\n")
    assert sh(f"{UTILS}/copy_data_dir.sh {tmp_path}/all {tmp_path}/all").returncode == 1


def test_subset_data_dir_script_stops_on_a_duplicate_key(tmp_path: Path) -> None:
    src = write_dir(
        tmp_path / "src",
        utt2spk="a-1 a\na-2 a\nb-1 b\n",
        spk2utt="a a-1 a-2\nb b-1\n",
        wav_scp="a-1 /w/a1.wav\na-2 /w/a2.wav\na-2 /w/a2-again.wav\nb-1 /w/b1.wav\n",
    )
    p = sh(f"{UTILS}/subset_data_dir.sh --first {src} 2 {tmp_path}/dest")
    assert p.returncode == 1 and not (tmp_path / "dest").exists()
    assert f"{src}/wav.scp:3: duplicate key 'a-2' (first on line 2)" in p.stderr
    p = sh(f"{UTILS}/copy_data_dir.sh {src} {tmp_path}/copy")
    assert p.returncode == 1 and not (tmp_path / "copy").exists()
    assert f"{src}/wav.scp:3: duplicate key 'a-2'" in p.stderr


def test_data_dir_scripts_report_an_unwritable_destination(tmp_path: Path) -> None:
    src = write_dir(tmp_path / "src", utt2spk="a-1 a\nb-1 b\n", spk2utt="a a-1\nb b-1\n", wav_scp="a-1 x\nb-1 y\n")
    (tmp_path / "file").write_text("not a directory\n")
    for cmd in (f"subset_data_dir.sh --first {src} 1", f"copy_data_dir.sh {src}"):
        p = sh(f"{UTILS}/{cmd} {tmp_path}/file/dest")
        assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
        assert f"error: {tmp_path}/file/dest: Not a directory" in p.stderr


@pytest.mark.parametrize("cmd", ["subset_data_dir.sh --first {src} 3 {dest}", "copy_data_dir.sh {src} {dest}"])
def test_data_dir_scripts_write_all_or_nothing(tmp_path: Path, cmd: str) -> None:
    """A write that fails part way (here a real file-size limit, EFBIG, as a full disk fails a
    write) leaves the destination as it was: no new utt2spk beside an old wav.scp."""

    def source(d: Path, spk: str) -> Path:
        utts = [f"{spk}{i}-{j}" for i in range(3) for j in range(2)]
        return write_dir(
            d,
            utt2spk="".join(f"{u} {u[:2]}\n" for u in utts),
            spk2utt="".join(f"{spk}{i} {spk}{i}-0 {spk}{i}-1\n" for i in range(3)),
            wav_scp="".join(f"{u} /a/long/path/{'x' * 400}/{u}.wav\n" for u in utts),  # 3 lines > 1 KiB
        )

    dest = tmp_path / "dest"
    cmd = f"{UTILS}/{cmd}"
    sh(cmd.format(src=source(tmp_path / "s", "s"), dest=dest), check=True)
    before = snapshot(dest)
    other = source(tmp_path / "t", "t")  # every file differs from the first source's
    p = sh("ulimit -f 1; " + cmd.format(src=other, dest=dest))  # files over 1 KiB (bash's unit) cannot be written
    assert p.returncode == 1 and "File too large" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert snapshot(dest) == before
    p = sh("ulimit -f 1; " + cmd.format(src=other, dest=tmp_path / "new"))
    assert p.returncode == 1 and not (tmp_path / "new").exists()


def test_validate_data_dir_script_rejects_ids_that_are_not_utf8(tmp_path: Path) -> None:
    """Kaldi's validate_data_dir.sh passes such an id; stage 2 then failed with "surrogates not allowed"."""
    d = tmp_path / "d"
    d.mkdir()
    (d / "utt2spk").write_bytes(b"a-1 a\na-2 a\nb-\xff1 b\n")
    (d / "spk2utt").write_bytes(b"a a-1 a-2\nb b-\xff1\n")
    (d / "wav.scp").write_bytes(b"a-1 /w/a1.wav\na-2 /w/a2.wav\nb-\xff1 /w/b1.wav\n")
    p = sh(f"{UTILS}/validate_data_dir.sh --no-text --no-feats {d}")
    assert p.returncode == 1
    assert f"{d}/utt2spk:3: id 'b-\\xff1' holds bytes that are not UTF-8" in p.stderr


def test_scripts_work_through_a_recipe_utils_symlink(tmp_path: Path) -> None:
    """Recipes link utils/ into egs/<corpus>/spk1; the scripts must find spkflow from there."""
    recipe = tmp_path / "recipe"
    recipe.mkdir()
    (recipe / "utils").symlink_to(UTILS)
    good(recipe / "data" / "train")
    p = sh(
        "utils/fix_data_dir.sh data/train && utils/validate_data_dir.sh --no-text --no-feats data/train",
        cwd=recipe,
        check=True,
    )
    assert "kept all 3 utterances" in p.stdout and "Successfully validated" in p.stdout
