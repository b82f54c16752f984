"""Training shards: writing (spkflow.data.shard_jobs), the format and its checks
(spkflow.data.shards) and planning (spkflow.train.shard_plan), on real fbank arks of synthesised
speech.  Reading them for training: test_stores.py."""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.audio import make_speakers
from spkflow.core.errors import InputError, UtteranceError
from spkflow.data.jobs import MergeError
from spkflow.data.shard_jobs import merge, prepare, read_plan, shard_order, voiced_shards, write_job
from spkflow.data.shards import ShardSet, load_shard
from spkflow.data.tables import read_kv
from spkflow.features.fbank import FbankOptions, VadOptions
from spkflow.features.jobs import extract_job, merge_jobs, write_split
from spkflow.train.batches import plan_epoch, rank_share
from spkflow.train.shard_plan import plan_shard_epoch, read_utt2shard

ROOT = Path(__file__).resolve().parents[2]


def _features(root: Path, compress: bool, num_spk: int = 8, num_utt: int = 6) -> Path:
    data = make_speakers(root, num_spk=num_spk, num_utt=num_utt, min_sec=0.6, max_sec=1.4)
    out = root / "fbank"
    split = write_split(data, out / "split", 1)
    opts = FbankOptions(num_mel_bins=24)
    extract_job(data, split[0], out / "data", "t", 1, opts, VadOptions(), compress=compress, progress=False)
    merge_jobs(data, out, out / "data", "t", 1)
    for f in ("utt2spk", "spk2utt"):
        shutil.copy(data / f, out / f)
    return out


def _shards(feats: Path, shard_utts: int = 10, nj: int = 2, voiced: bool = False) -> Path:
    out = feats / "shards"
    prepare(feats, out, shard_utts, run=4, seed=0, voiced=voiced)
    for j in range(1, nj + 1):
        write_job(feats, out, j, nj)
    merge(out, nj)
    return out


@pytest.fixture(
    scope="module",
    params=[(False, False), (True, False), (False, True), (True, True)],
    ids=["float", "compressed", "float-voiced", "compressed-voiced"],
)
def feats(request, tmp_path_factory) -> Path:
    compress, voiced = request.param
    root = tmp_path_factory.mktemp("shards_voiced" if voiced else "shards_all")
    f = _features(root, compress=compress)
    _shards(f, voiced=voiced)
    assert voiced_shards(f / "shards") == voiced
    return f


def _voiced(feats: Path) -> bool:
    """Whether the fixture asked for shards of the voiced frames (known from its folder's name)."""
    return "shards_voiced" in str(feats)


def test_shards_hold_every_utterance_once_with_the_ark_bytes(feats):
    """Every utterance once; a member is the ark's record byte for byte, or (voiced shards) the
    record of the rows the VAD keeps, each row's bytes as stored, which kaldiio decodes to
    exactly those rows of the whole matrix."""
    import kaldiio

    from spkflow.data.ark import KaldiArkReader

    s = ShardSet(feats / "shards" / "shards.list")
    assert sorted(s.utt2shard) == sorted(read_kv(feats / "feats.scp"))
    assert all(n <= 10 + 3 for n in s.num_utts) and sum(s.num_utts) == 48
    arks, vad = KaldiArkReader(feats / "feats.scp"), KaldiArkReader(feats / "vad.scp")
    cut = 0
    for i in range(len(s)):
        shard = s.load(i, read_kv(feats / "utt2spk"))
        for u in shard.utts:
            assert shard.speaker(u) == u.split("-")[0]
            if not _voiced(feats):
                assert shard.payload(u, "feats") == arks.record_bytes(u)
                continue
            assert "feats" not in shard.offsets and "vad" not in shard.offsets
            rec = shard.payload(u, "feats_voiced")
            fmt = rec[: rec.index(b" ") + 1]
            assert arks.record_bytes(u).startswith(fmt)  # the same format, not decoded and written again
            (_, got), *_ = kaldiio.load_ark(io.BytesIO(b"u " + rec))
            (_, whole), *_ = kaldiio.load_ark(io.BytesIO(b"u " + arks.record_bytes(u)))
            keep = np.flatnonzero(vad.read(u) > 0.5)
            want = whole[keep] if 0 < len(keep) < len(whole) else whole
            assert np.array_equal(got, want)
            cut += len(want) < len(whole)
    assert cut >= 10 or not _voiced(feats)  # the VAD of these utterances drops frames of most
    # a shard holds several speakers, and every speaker is in several shards
    per_spk: dict[str, set[int]] = {}
    for u, i in s.utt2shard.items():
        per_spk.setdefault(u.split("-")[0], set()).add(i)
    assert all(len(v) >= 2 for v in per_spk.values())
    assert len({u.split("-")[0] for u in shard.utts}) >= 2


def test_plan_guarantees(feats):
    """Each utterance at most once, N distinct speakers x M, deterministic in (seed, epoch),
    another grouping next epoch, disjoint ranks; the coverage is below the random-access plan's."""
    u2s = read_utt2shard(feats / "shards" / "utt2shard")
    spk2utt = feats / "spk2utt"
    p = plan_shard_epoch(spk2utt, u2s, 4, 2, seed=0, epoch=1, pool=2, streams=2)
    again = plan_shard_epoch(spk2utt, u2s, 4, 2, seed=0, epoch=1, pool=2, streams=2)
    other = plan_shard_epoch(spk2utt, u2s, 4, 2, seed=0, epoch=2, pool=2, streams=2)
    assert np.array_equal(p.indices, again.indices) and not np.array_equal(p.indices, other.indices)
    used = p.indices.ravel()
    assert len(np.unique(used)) == len(used)
    for b in p.batches:
        spk = [u.split("-")[0] for u in b]
        assert len(set(spk)) == 4 and all(spk[2 * i] == spk[2 * i + 1] for i in range(4))
    # every batch reads the shards of one window only
    for b in p.batches:
        assert len({u2s[u] for u in b}) <= 2
    r0 = plan_shard_epoch(spk2utt, u2s, 4, 2, seed=0, epoch=1, pool=2, streams=2, world_size=2, rank=0)
    r1 = plan_shard_epoch(spk2utt, u2s, 4, 2, seed=0, epoch=1, pool=2, streams=2, world_size=2, rank=1)
    assert r0.batches == rank_share(p.batches, 2, 0) and r1.batches == rank_share(p.batches, 2, 1)
    assert not set(r0.indices.ravel()) & set(r1.indices.ravel())
    full = plan_epoch(spk2utt, 4, 2, seed=0, epoch=1)
    assert p.stats.coverage <= full.stats.coverage


def test_order_spreads_speakers_over_shards():
    utt2spk = {f"s{s}-u{u:02d}": f"s{s}" for s in range(20) for u in range(30)}
    shards = shard_order(utt2spk, 100, run=5, seed=0)
    assert sorted(u for s in shards for u in s) == sorted(utt2spk)
    assert all(len({u.split("-")[0] for u in s}) == 20 for s in shards)  # every speaker in every shard
    assert shard_order(utt2spk, 100, run=5, seed=0) == shards and shard_order(utt2spk, 100, run=5, seed=1) != shards


def test_resumed_writing_equals_uninterrupted(tmp_path):
    feats = _features(tmp_path, compress=False, num_spk=3, num_utt=4)
    out = _shards(feats, shard_utts=4, nj=1)
    want = {p.name: p.read_bytes() for p in out.glob("shard.*.tar")}
    # a killed run: the list not written, one shard gone, a temporary left behind
    (out / "shards.list").unlink()
    victim = sorted(want)[1]
    (out / victim).unlink()
    (out / f".{victim}.x.tmp").write_bytes(b"partial")
    prepare(feats, out, 4, run=4, seed=0)
    assert write_job(feats, out, 1, 1) == 1  # only the missing shard
    merge(out, 1)
    assert {p.name: p.read_bytes() for p in out.glob("shard.*.tar")} == want
    # other options: the old shards go
    prepare(feats, out, 6, run=4, seed=0)
    assert not list(out.glob("shard.*.tar")) and len(read_plan(out)) == 2


def test_bad_shards_are_named(tmp_path):
    feats = _features(tmp_path, compress=False, num_spk=3, num_utt=4)
    out = _shards(feats, shard_utts=4, nj=1)
    lst = out / "shards.list"
    name = sorted(out.glob("shard.*.tar"))[0]
    # a missing shard at merge time
    data = name.read_bytes()
    name.unlink()
    with pytest.raises(MergeError, match=f"{name.name} is missing"):
        merge(out, 1)
    # the list naming a missing file
    with pytest.raises(InputError, match=f"{name.name} is missing"):
        ShardSet(lst)
    # a truncated shard: named by the list check and by the reader
    name.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=f"{name.name} has {len(data) // 2} bytes, the list says {len(data)}"):
        ShardSet(lst)
    with pytest.raises(InputError, match=f"{name.name}.*(truncated|ended|readable)"):
        load_shard(name)
    name.write_bytes(data)
    # utterances not in the data dir
    s = ShardSet(lst)
    known = read_kv(feats / "utt2spk")
    first = load_shard(name).utts[0]
    del known[first]
    with pytest.raises(InputError, match=f"{name.name}.*'{first}' is not in the training data dir"):
        s.load(0, known)
    # nothing was lost: the shard files are as written
    assert name.read_bytes() == data


def test_voiced_shards_name_a_vad_of_another_length(tmp_path):
    """Voiced shards cut each feature matrix by its VAD: a VAD entry of another length is one error
    naming the utterance and vad.scp, and the shard that would hold it is not written."""
    import kaldiio

    from spkflow.core.errors import UtteranceError

    feats = _features(tmp_path, compress=True, num_spk=3, num_utt=4)
    vad = kaldiio.load_scp(str(feats / "vad.scp"))
    bad = sorted(vad)[5]
    kaldiio.save_ark(
        str(feats / "vad_cut.ark"),
        {k: (v[:-3] if k == bad else v) for k, v in vad.items()},
        scp=str(feats / "vad.scp"),
    )
    out = feats / "shards"
    prepare(feats, out, 4, run=4, seed=0, voiced=True)
    with pytest.raises(UtteranceError, match=rf"'{bad}' \(.*vad\.scp\): \d+ VAD frames but \d+ feature frames"):
        write_job(feats, out, 1, 1)
    holder = next(name for name, utts in read_plan(out) if bad in utts)
    assert not (out / holder).exists()


def test_audio_shards_hold_what_a_pipe_writes_and_name_a_failing_one(tmp_path):
    """A ``cmd |`` entry of the wav.scp is run as stage 5 and the loaders run it
    (:func:`spkflow.data.pipes.run_pipe`): its output is the member; a failing one names the
    utterance, the command and its exit status, and the shard is not written."""
    data = make_speakers(tmp_path, num_spk=2, num_utt=2, fmt="wav")
    wav = read_kv(data / "wav.scp")
    piped, failing = sorted(wav)[:2]
    lines = dict(wav)
    lines[piped] = f"cat {wav[piped]} |"
    lines[failing] = "sh -c 'echo no such input >&2; exit 4' |"
    (data / "wav.scp").write_text("".join(f"{u} {e}\n" for u, e in sorted(lines.items())))
    out = tmp_path / "shards"
    prepare(data, out, 10, run=4, seed=0, audio=True)
    with pytest.raises(UtteranceError, match=f"{failing}.*exit code 4; stderr: no such input"):
        write_job(data, out, 1, 1, audio=True)
    assert not list(out.glob("shard.*.tar"))
    lines[failing] = wav[failing]
    (data / "wav.scp").write_text("".join(f"{u} {e}\n" for u, e in sorted(lines.items())))
    assert write_job(data, out, 1, 1, audio=True) == 1
    shard = load_shard(next(out.glob("shard.*.tar")))
    assert shard.audio_field(piped) == "wav" and shard.payload(piped, "wav") == Path(wav[piped]).read_bytes()


def test_make_shards_script(tmp_path):
    feats = _features(tmp_path, compress=True, num_spk=3, num_utt=4)
    env = {**os.environ, "SPKFLOW_PYTHON": sys.executable}
    run = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts/feats/make_shards.sh"),
            "--nj",
            "2",
            "--shard-utts",
            "5",
            str(feats),
            str(tmp_path / "sh"),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr
    assert "Succeeded writing 2 shards" in run.stderr
    assert len(ShardSet(tmp_path / "sh" / "shards.list")) == 2


def test_train_inputs_says_what_the_shards_hold(tmp_path, capsys):
    import yaml

    from spkflow.bin.train_inputs import main

    for feats_type, vad, want in (("ark", True, "voiced features"), ("ark", False, "features"), ("raw", True, "audio")):
        cfg = tmp_path / f"{feats_type}.yaml"
        fe = {"feats_type": feats_type, "vad": vad}
        doc = {"frontend": fe, "model": {"name": "ecapa_tdnn"}, "loss": {"name": "ge2e"}}
        cfg.write_text(yaml.safe_dump(doc))
        assert main(["--config", str(cfg), "--shards"]) == 0
        assert capsys.readouterr().out.strip() == want


def _make_shards(feats: Path, out: Path, *opts: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPKFLOW_PYTHON": sys.executable}
    cmd = ["bash", str(ROOT / "scripts/feats/make_shards.sh"), *opts, str(feats), str(out)]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=out.parent)


def _flip(path: Path, start: int, n: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[start : start + n] = bytes(b ^ 0x5A for b in raw[start : start + n])
    path.write_bytes(bytes(raw))


def test_a_damaged_member_is_named_and_written_again_by_a_rerun(tmp_path):
    """1,000 bytes flipped inside one utterance's voiced-feature member: reading the shard names
    the shard and the member; make_shards.sh run again says so and writes that shard again,
    byte for byte as before, keeping the others."""
    feats = _features(tmp_path, compress=False, num_spk=3, num_utt=4)
    out = tmp_path / "sh"
    first = _make_shards(feats, out, "--nj", "2", "--shard-utts", "4", "--voiced", "true")
    assert first.returncode == 0, first.stderr
    before = {p.name: p.read_bytes() for p in out.glob("shard.*.tar")}
    lst = (out / "shards.list").read_text()
    s = ShardSet(out / "shards.list")
    victim = s.path(1)
    shard = s.load(1)
    utt = shard.utts[1]
    off, size = shard.offsets["feats_voiced"][utt], shard.sizes["feats_voiced"][utt]
    assert size > 1100
    _flip(Path(victim), off + 64, 1000)
    want = rf"shard\.000002\.tar: member '{utt}\.feats_voiced' fails its checksum"
    with pytest.raises(InputError, match=want):
        load_shard(victim)
    with pytest.raises(InputError, match=want):
        ShardSet(out / "shards.list").load(1)
    kept = {p.name: p.stat().st_mtime_ns for p in out.glob("shard.*.tar") if str(p) != victim}
    again = _make_shards(feats, out, "--nj", "2", "--shard-utts", "4", "--voiced", "true")
    assert again.returncode == 0, again.stderr
    assert re.search(want + r".*writing it again", again.stderr)
    assert {p.name: p.read_bytes() for p in out.glob("shard.*.tar")} == before
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("shard.*.tar") if str(p) != victim} == kept
    assert (out / "shards.list").read_text() == lst


def test_a_cut_shard_is_written_again_and_listed_at_its_full_size(tmp_path):
    """A shard cut to half its size: make_shards.sh run again names it and writes it again, and
    shards.list lists the full size, not the cut one."""
    feats = _features(tmp_path, compress=True, num_spk=3, num_utt=4)
    out = tmp_path / "sh"
    assert _make_shards(feats, out, "--nj", "1", "--shard-utts", "4").returncode == 0
    before = {p.name: p.read_bytes() for p in out.glob("shard.*.tar")}
    lst = (out / "shards.list").read_text()
    victim = sorted(out.glob("shard.*.tar"))[0]
    victim.write_bytes(before[victim.name][: len(before[victim.name]) // 2])
    again = _make_shards(feats, out, "--nj", "1", "--shard-utts", "4")
    assert again.returncode == 0, again.stderr
    assert re.search(rf"{victim.name}: .*(truncated|end|past).*writing it again", again.stderr)
    assert {p.name: p.read_bytes() for p in out.glob("shard.*.tar")} == before
    assert (out / "shards.list").read_text() == lst


def test_every_member_is_listed_with_its_checksum(tmp_path):
    """The last member lists every other one (crc32, size, name), in order; a shard without it
    (cut short, or written before checksums) or with a member renamed is named, not read."""
    import tarfile
    import zlib

    from spkflow.data.shards import CHECKSUMS, write_shard

    members = [("a-1", "spk", b"a"), ("a-1", "feats", bytes(range(200))), ("b-2", "spk", b"b")]
    path = tmp_path / "shard.000001.tar"
    write_shard(path, members)
    with tarfile.open(path) as tar:
        names = tar.getnames()
        text = tar.extractfile(CHECKSUMS).read().decode()  # type: ignore[union-attr]
    assert names == ["a-1.spk", "a-1.feats", "b-2.spk", CHECKSUMS]
    assert text.splitlines() == [f"{zlib.crc32(p):08x} {len(p)} {u}.{f}" for u, f, p in members]
    assert load_shard(path).utts == ["a-1", "b-2"]
    old = tmp_path / "old.tar"  # as written before checksums
    with tarfile.open(old, "w", format=tarfile.PAX_FORMAT) as tar:
        for u, f, p in members:
            info = tarfile.TarInfo(f"{u}.{f}")
            info.size = len(p)
            tar.addfile(info, io.BytesIO(p))
    with pytest.raises(InputError, match=rf"old\.tar: has no '{CHECKSUMS}' member.*make_shards"):
        load_shard(old)
    raw = path.read_bytes()
    path.write_bytes(raw.replace(b"a-1.feats", b"a-9.feats", 1))  # the member's header, not its listing
    with pytest.raises(InputError, match=r"member 'a-9\.feats' .* is listed as 'a-1\.feats'"):
        load_shard(path)


def test_reading_a_directory_as_a_shard_is_named(tmp_path):
    (tmp_path / "shard.000001.tar").mkdir()
    with pytest.raises(InputError, match=r"shard\.000001\.tar: is a directory, not a shard"):
        load_shard(tmp_path / "shard.000001.tar")


@pytest.mark.parametrize("nj", ["0", "-1", "two", ""])
def test_make_shards_refuses_a_bad_nj_with_its_usage(tmp_path, nj):
    feats = _features(tmp_path, compress=True, num_spk=2, num_utt=2)
    out = tmp_path / "sh"
    p = _make_shards(feats, out, "--nj", nj)
    assert p.returncode == 1
    assert f"--nj must be a positive integer, got '{nj}'" in p.stderr and "Usage:" in p.stderr
    assert "grep" not in p.stderr and "Traceback" not in p.stderr
    assert not out.exists()


def test_a_batch_wider_than_the_speakers_says_what_to_set(tmp_path):
    """N above the speaker count: no pool can help, so the error says N is more than the
    speakers and what to set, not "raise the pool"; a pool too small still says raise it."""
    spk2utt = {f"s{s:02d}": [f"s{s:02d}-u{u}" for u in range(6)] for s in range(20)}
    u2s = {u: f"shard{int(u[1:3]) % 4}" for us in spk2utt.values() for u in us}
    with pytest.raises(InputError, match=r"--num-spk 32 is more than the 20 speakers with at least 2 utterances") as e:
        plan_shard_epoch(spk2utt, u2s, 32, 2, seed=0, epoch=1, pool=8)
    assert "pool" not in str(e.value).split("whatever the pool")[-1] and "--num_spk" in str(e.value)
    with pytest.raises(InputError, match="raise the pool"):
        plan_shard_epoch(spk2utt, u2s, 8, 2, seed=0, epoch=1, pool=1)
    assert len(plan_shard_epoch(spk2utt, u2s, 8, 2, seed=0, epoch=1, pool=4)) > 0


def test_the_slow_storage_bench_says_how_to_get_fuse3(tmp_path):
    """Without fusermount3 on the PATH the benchmark stops before any work, saying what to install."""
    env = {**os.environ, "PATH": str(tmp_path)}  # nothing there: fuse3's tools are not found
    p = subprocess.run(
        [sys.executable, str(ROOT / "test/bench/bench_slow_storage.py"), "--json", str(tmp_path / "out.json")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert p.returncode == 2
    assert "fusermount3 not found" in p.stderr and "apt-get install fuse3" in p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "out.json").exists()
