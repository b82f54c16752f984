"""Writing a training set's shards (:mod:`spkflow.data.shards`) as ``nj`` resumable jobs.

``scripts/feats/make_shards.sh`` runs three steps, each ``python -m spkflow.bin.make_shards``:

1. :func:`prepare` decides which utterances go in which shard (:func:`shard_order`) and writes
   that as ``plan`` with the ``settings`` that made it; a changed feature set or option removes
   the shards of the old plan first, so no shard of another plan survives.
2. :func:`write_job` (job ``j`` of ``nj`` writes shards ``j, j + nj, ...``) copies each
   utterance's ark records into its shard; a shard is written atomically, so one that exists
   under its name is complete and a rerun (a killed or failed job) writes only the missing ones.
3. :func:`merge` checks that every planned shard is there and writes ``utt2shard`` and then
   ``shards.list`` (the file that marks the set complete), atomically.

The order: a speaker's utterances (in a fixed pseudo-random order per speaker) are cut into
runs of ``run`` utterances; round ``r`` holds the ``r``-th run of every speaker that has one, the
speakers of a round in a pseudo-random order; the rounds one after the other are cut into shards
of about ``shard_utts`` utterances (whole runs).  So a shard holds runs of many speakers and a
speaker's runs are spread over many shards: any few shards in memory offer many speakers with
several utterances each, which is what an N x M batch needs (:mod:`spkflow.train.shard_plan`).
WeSpeaker's ``make_shard_list.py`` shuffles utterances one by one (a speaker's utterances then
rarely meet in memory) or keeps the list's order (one speaker per shard).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from spkflow.core.atomic import write_text_atomic
from spkflow.core.errors import InputError, UtteranceError
from spkflow.data.ark import KaldiArkReader, select_rows
from spkflow.data.jobs import MergeError, log_line
from spkflow.data.pipes import is_pipe, pipe_command, run_pipe
from spkflow.data.shards import AUDIO_EXTS, CHECKSUMS, FIELDS, load_shard, shard_name, write_shard
from spkflow.data.tables import c_key, read_kv
from spkflow.data.voiced import voiced_frames

__all__ = ["shard_order", "prepare", "read_plan", "voiced_shards", "write_job", "merge", "SCPS"]

#: the scp of each shard field, in the features dir of stage 2
SCPS = {"feats": "feats.scp", "vad": "vad.scp", "cmvn": "cmvn_utt.scp", "cmvn_voiced": "cmvn_utt_voiced.scp"}
_ORDER_PURPOSE = 0x73686F72  # "shor": the stream of the shard order, apart from every other
_VOICED = " frames=voiced"  # in ``settings``: shards of the voiced frames (:func:`voiced_shards`)


def _permutation(n: int, *words: int) -> np.ndarray:
    """A permutation of range(n) from PCG64's raw output (no Generator method): the same on any numpy."""
    if n <= 1:
        return np.arange(n, dtype=np.int64)
    raw = np.random.PCG64(np.random.SeedSequence(list(words))).random_raw(n).astype(np.uint64)
    return np.argsort(raw, kind="stable").astype(np.int64)


def shard_order(utt2spk: dict[str, str], shard_utts: int, run: int = 8, seed: int = 0) -> list[list[str]]:
    """The utterances of each shard, in shard order (see the module doc)."""
    if shard_utts < 1 or run < 1:
        raise ValueError(f"shard_utts and run must be >= 1, got {shard_utts}, {run}")
    by_spk: dict[str, list[str]] = {}
    for utt in sorted(utt2spk, key=c_key):
        by_spk.setdefault(utt2spk[utt], []).append(utt)
    speakers = sorted(by_spk, key=c_key)
    runs: list[list[list[str]]] = []
    for s, spk in enumerate(speakers):
        utts = by_spk[spk]
        utts = [utts[i] for i in _permutation(len(utts), seed, _ORDER_PURPOSE, 0, s)]
        for r in range(0, len(utts), run):
            if r // run == len(runs):
                runs.append([])
            runs[r // run].append(utts[r : r + run])
    shards: list[list[str]] = [[]]
    for r, rnd in enumerate(runs):
        for i in _permutation(len(rnd), seed, _ORDER_PURPOSE, 1, r):
            if len(shards[-1]) >= shard_utts:
                shards.append([])
            shards[-1].extend(rnd[i])
    return [s for s in shards if s]


def _settings(feats_dir: Path, shard_utts: int, run: int, seed: int, audio: bool, voiced: bool) -> str:
    digest = hashlib.sha256()
    arks: set[str] = set()
    for name in ("utt2spk", "wav.scp") if audio else ("utt2spk", *SCPS.values()):
        p = feats_dir / name
        text = p.read_bytes() if p.is_file() else b"-"
        digest.update(name.encode() + text)
        if name in SCPS.values():
            arks.update(
                line.split(maxsplit=1)[1].rsplit(":", 1)[0] for line in text.decode().splitlines() if " " in line
            )
    for ark in sorted(arks):  # features written again under the same names and offsets
        st = os.stat(ark) if os.path.isfile(ark) else None
        digest.update(f"{ark} {st.st_size if st else -1} {st.st_mtime_ns if st else -1}".encode())
    frames = "" if audio else _VOICED if voiced else " frames=all"
    return (
        f"features={feats_dir} sha256={digest.hexdigest()} shard_utts={shard_utts} run={run} seed={seed}{frames}"
        f" members={CHECKSUMS}\n"
    )


def prepare(
    feats_dir: str | os.PathLike[str],
    shard_dir: str | os.PathLike[str],
    shard_utts: int,
    run: int,
    seed: int,
    audio: bool = False,
    voiced: bool = False,
) -> int:
    """Write ``plan`` and ``settings``; remove the shards of a different earlier plan.  Returns
    the number of shards.  ``audio``: shards of ``feats_dir``'s audio files (its ``wav.scp``: a
    data dir) instead of its features; ``voiced``: of the voiced frames only (``feats_voiced``
    members, needs ``vad.scp``; :mod:`spkflow.data.shards`)."""
    feats_dir, shard_dir = Path(feats_dir), Path(shard_dir)
    scp = feats_dir / ("wav.scp" if audio else "feats.scp")
    if not scp.is_file():
        why = "audio shards are made from a data dir" if audio else "shards are made of stage 2's features"
        raise InputError(scp, None, f"not found: {why}")
    if audio and (feats_dir / "segments").is_file():
        raise InputError(feats_dir / "segments", None, "audio shards hold whole files: cut segments first")
    if voiced and not audio and not (feats_dir / "vad.scp").is_file():
        raise InputError(feats_dir / "vad.scp", None, "not found: shards of the voiced frames need stage 2's VAD")
    have = set(read_kv(scp))
    utt2spk = {u: s for u, s in read_kv(feats_dir / "utt2spk").items() if u in have}
    if not utt2spk:
        raise InputError(feats_dir / "utt2spk", None, f"no utterance of it is in {scp}")
    settings = _settings(feats_dir, shard_utts, run, seed, audio, voiced) + ("audio\n" if audio else "")
    shard_dir.mkdir(parents=True, exist_ok=True)
    old = shard_dir / "settings"
    if not old.is_file() or old.read_text(encoding="utf-8") != settings:
        for p in [*shard_dir.glob("shard.*.tar"), shard_dir / "shards.list", shard_dir / "utt2shard", old]:
            p.unlink(missing_ok=True)
    shards = shard_order(utt2spk, shard_utts, run, seed)
    text = "".join(f"{shard_name(i)} {' '.join(utts)}\n" for i, utts in enumerate(shards))
    write_text_atomic(shard_dir / "plan", text)
    write_text_atomic(old, settings)
    return len(shards)


def voiced_shards(shard_dir: str | os.PathLike[str]) -> bool:
    """Whether :func:`prepare` planned ``shard_dir``'s shards of the voiced frames only."""
    settings = Path(shard_dir) / "settings"
    return settings.is_file() and _VOICED in settings.read_text(encoding="utf-8")


def read_plan(shard_dir: str | os.PathLike[str]) -> list[tuple[str, list[str]]]:
    path = Path(shard_dir) / "plan"
    if not path.is_file():
        raise InputError(path, None, "not found (make_shards prepare writes it first)")
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        name, *utts = line.split()
        out.append((name, utts))
    return out


def _audio_member(utt: str, entry: str) -> tuple[str, bytes]:
    """(extension, bytes) of a wav.scp entry: a file as stored, or what a pipe writes (as wav)."""
    entry = entry.strip()
    if is_pipe(entry):
        return "wav", run_pipe(pipe_command(entry), utt)
    ext = Path(entry).suffix.lower().lstrip(".")
    if ext not in AUDIO_EXTS:
        raise UtteranceError(utt, entry, f"not a file of a known audio type ({', '.join(AUDIO_EXTS)})")
    try:
        return ext, Path(entry).read_bytes()
    except OSError as e:
        raise UtteranceError(utt, entry, f"cannot read: {e.strerror}") from None


def _voiced_record(feats: KaldiArkReader, vad: KaldiArkReader, utt: str) -> bytes:
    """``utt``'s feature record with the rows its VAD keeps (all when it keeps none or all,
    as :class:`spkflow.train.loader.NxMCropDataset` then crops them all)."""
    record, rows = feats.record_bytes(utt), feats.num_rows(utt)
    v = vad.read(utt, cache_header=False)
    if len(v) != rows:
        raise UtteranceError(utt, vad.scp, f"{len(v)} VAD frames but {rows} feature frames")
    keep = voiced_frames(v)
    return record if keep is None else select_rows(record, keep)


def write_job(
    feats_dir: str | os.PathLike[str], shard_dir: str | os.PathLike[str], job: int, nj: int, audio: bool = False
) -> int:
    """Write the missing shards ``job - 1, job - 1 + nj, ...`` (1-based ``job``); returns how many.
    Which frames (all or voiced) comes from the ``settings`` that :func:`prepare` wrote."""
    feats_dir, shard_dir = Path(feats_dir), Path(shard_dir)
    readers = {f: KaldiArkReader(feats_dir / scp) for f, scp in SCPS.items() if (feats_dir / scp).is_file()}
    voiced = voiced_shards(shard_dir)
    if audio:
        wav = read_kv(feats_dir / "wav.scp")
        readers = {}
    utt2spk = read_kv(feats_dir / "utt2spk")
    written = 0
    plan = read_plan(shard_dir)
    for k in range(job - 1, len(plan), nj):
        name, utts = plan[k]
        out = shard_dir / name
        if _intact(out, utts):
            continue  # written atomically and checked: kept
        members = []
        for u in utts:
            members.append((u, "spk", utt2spk[u].encode("utf-8", "surrogateescape")))
            if audio:
                members.append((u, *_audio_member(u, wav[u])))
            if voiced:
                members.append((u, "feats_voiced", _voiced_record(readers["feats"], readers["vad"], u)))
                if "cmvn_voiced" in readers:
                    members.append((u, "cmvn_voiced", readers["cmvn_voiced"].record_bytes(u)))
                continue
            for field in FIELDS:
                if field in readers:
                    members.append((u, field, readers[field].record_bytes(u)))
        size = write_shard(out, members)
        written += 1
        log_line(f"{out}: {len(utts)} utterances, {size / 1e6:.1f} MB")
    return written


def _intact(path: Path, utts: list[str]) -> bool:
    """Whether the shard at ``path`` is there, reads back whole (every member against its crc32)
    and holds ``utts``; a damaged one is named in the job's log and then written again."""
    if not path.exists():
        return False
    try:
        held = load_shard(path).utts
        if held != utts:
            raise InputError(path, None, "holds other utterances than the plan")
    except InputError as e:
        log_line(f"{e}: writing it again")
        return False
    return True


def merge(shard_dir: str | os.PathLike[str], nj: int) -> tuple[int, int]:
    """Check every planned shard exists; write ``utt2shard``, then ``shards.list``.  Returns
    (shards, bytes)."""
    shard_dir = Path(shard_dir)
    plan = read_plan(shard_dir)
    missing = [(k, name) for k, (name, _) in enumerate(plan) if not (shard_dir / name).is_file()]
    if missing:
        k, name = missing[0]
        raise MergeError(
            f"{shard_dir / name} is missing ({len(missing)} of {len(plan)} shards missing): "
            f"job {k % nj + 1} did not write it, see its log; rerun to write only the missing shards"
        )
    sizes = [(shard_dir / name).stat().st_size for name, _ in plan]
    write_text_atomic(shard_dir / "utt2shard", "".join(f"{u} {name}\n" for name, utts in plan for u in utts))
    write_text_atomic(
        shard_dir / "shards.list",
        "".join(f"{name} {len(utts)} {n}\n" for (name, utts), n in zip(plan, sizes, strict=True)),
    )
    return len(plan), sum(sizes)
