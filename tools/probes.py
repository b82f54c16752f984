"""Reliability probes: the reproductions of the last review round, kept so the next round starts
from them.  Each probe runs one reproduction of a BAD or WEAK answer (issue 48: untrusted file
names, a user's outputs, corrupt shards, stops, the WEAK answers) against this checkout and a
model, in a temporary folder, and prints one line:

    OK    the answer is right now (a refusal naming the file, or the right behaviour)
    WEAK  an answer that is not wrong but not clear (the grade the round gave it)
    BAD   a wrong answer: a command run, a user's file replaced, damage read silently
    SKIP  not run (``--slow`` runs the slow ones; or what it needs is missing here)

with one line of evidence, then the counts.  A report, not a test: the exit status is 0 whatever
it finds (a BAD found here is where a test starts; tests live under test/).

    .venv/bin/python tools/probes.py [--model PACK_OR_DIR] [--only NAME ...] [--slow] [--list] [--keep]

``--model``: a packed model or model dir (the demo's ``exp/spk_train/packed/spk_train.zip``);
without it a tiny ECAPA with random weights (test/helpers) is made and packed: the probes check
what the commands do with files, not what the model scores.  Audio is synthetic speech made
here.  The probes run the commands as a user would (``python -m spkflow.bin.NAME``, the
scripts), with this checkout on PYTHONPATH, one at a time; about 5 minutes on 2 cores without
``--slow``.  Add a probe for every BAD or WEAK answer a round finds (a function below with the
``@probe`` decorator: name, the grade when it fails, what it reproduces).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "test"))  # the test helpers: synthetic speech, tiny models

PY = sys.executable


@dataclass
class Probe:
    name: str
    grade: str  # BAD or WEAK: what it is when the answer is still wrong
    what: str
    run: Callable[[Ctx], tuple[str, str]]
    slow: bool = False


PROBES: list[Probe] = []


def probe(name: str, grade: str, what: str, slow: bool = False) -> Callable:
    def add(fn: Callable[[Ctx], tuple[str, str]]) -> Callable[[Ctx], tuple[str, str]]:
        PROBES.append(Probe(name, grade, what, fn, slow))
        return fn

    return add


@dataclass
class Ctx:
    """What a probe gets: its own empty folder, the model, and helpers to run commands."""

    root: Path  # shared across probes: model, audio
    model: Path
    work: Path = field(default=Path())
    _voices: int = 0

    def env(self) -> dict[str, str]:
        return dict(
            os.environ,
            PYTHONPATH=str(ROOT),
            PATH=f"{Path(PY).parent}:{ROOT / 'utils'}:{os.environ['PATH']}",
            LC_ALL="C",
            OMP_NUM_THREADS="1",
            SPKFLOW_CACHE=str(self.root / "cache"),
        )

    def run(self, args: list, timeout: float = 600, cwd: Path | None = None, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(a) for a in args],
            env=self.env(),
            cwd=cwd or self.work,
            capture_output=True,
            text=True,
            timeout=timeout,
            errors="backslashreplace",
            **kw,
        )

    def spk(self, cmd: str, *args) -> subprocess.CompletedProcess:
        return self.run([PY, "-m", f"spkflow.bin.{cmd}", *args])

    def voice(self, path: Path | bytes, seconds: float = 3.0, rate: int = 16000, fmt: dict | None = None) -> Path:
        """A file of synthetic speech (a new voice each call)."""
        import numpy as np
        import soundfile as sf

        from helpers.audio import synth_voice

        self._voices += 1
        x = synth_voice(np.random.default_rng(self._voices), 90 + 15 * self._voices, (500.0, 1500.0, 2500.0), seconds)
        if isinstance(path, Path):
            path.parent.mkdir(parents=True, exist_ok=True)
        sf.write(path, x, rate, **(fmt or {}))
        return path if isinstance(path, Path) else Path(os.fsdecode(path))

    def speakers(self, name: str, num_spk: int = 3, num_utt: int = 3, seconds: float = 2.0) -> Path:
        """Folders of recordings, one per speaker -> a data dir (make_data_dir)."""
        src = self.work / f"{name}_audio"
        for s in range(num_spk):
            for u in range(num_utt):
                self.voice(src / f"spk{s}" / f"u{u}.wav", seconds)
        out = self.work / name
        p = self.spk("make_data_dir", src, out)
        if p.returncode:
            raise RuntimeError(f"make_data_dir failed: {tail(p)}")
        return out


def tail(p: subprocess.CompletedProcess, n: int = 1) -> str:
    """The last ``n`` lines of a command's stderr (else stdout), one line; progress bars left out."""
    text = re.sub(r"[\w ]*: *\d+%\|[^|]*\|[^\]\n]*\]", "", (p.stderr or p.stdout or "").replace("\r", "\n"))
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(line.strip()[-300:] for line in lines[-n:]) or f"(exit {p.returncode}, no output)"


def said(p: subprocess.CompletedProcess) -> str:
    return f"exit {p.returncode}: {tail(p)}"


# ----------------------------------------------------------------------------- a path is a path


def _pipe(ctx: Ctx, args_of: Callable[[str, Path], list]) -> tuple[str, str]:
    mark = ctx.work / "pwned"
    p = ctx.run(args_of(f"touch {mark} |", ctx.voice(ctx.work / "a.wav")))
    if mark.exists():
        return "BAD", f"the path was run as a command ({mark} created); {said(p)}"
    return "OK", f"nothing run; {said(p)}"


@probe("pipe-verify", "BAD", 'verify --model M "touch x |" a.wav runs the command')
def _(ctx: Ctx) -> tuple[str, str]:
    return _pipe(ctx, lambda cmd, a: [PY, "-m", "spkflow.bin.verify", "--model", ctx.model, cmd, a])


@probe("pipe-verify-pairs", "BAD", "a --pairs file naming 'touch x |' runs the command")
def _(ctx: Ctx) -> tuple[str, str]:
    def args(cmd: str, a: Path) -> list:
        (ctx.work / "pairs").write_text(f"{cmd}\t{a}\n")
        return [PY, "-m", "spkflow.bin.verify", "--model", ctx.model, "--pairs", ctx.work / "pairs"]

    return _pipe(ctx, args)


@probe("pipe-identify", "BAD", 'identify --enrol D "touch x |" runs the command')
def _(ctx: Ctx) -> tuple[str, str]:
    enrol = ctx.speakers("enrol", 2, 2)
    return _pipe(ctx, lambda cmd, a: [PY, "-m", "spkflow.bin.identify", "--model", ctx.model, "--enrol", enrol, cmd])


@probe("pipe-diarize", "BAD", 'diarize --out o "touch x |" runs the command')
def _(ctx: Ctx) -> tuple[str, str]:
    return _pipe(ctx, lambda cmd, a: [PY, "-m", "spkflow.bin.diarize", "--model", ctx.model, "--out", "o", cmd])


@probe("pipe-api", "BAD", 'Embedder.embed_file("touch x |") runs the command')
def _(ctx: Ctx) -> tuple[str, str]:
    code = "import sys\nfrom spkflow import Embedder\nEmbedder.from_pretrained(sys.argv[1]).embed_file(sys.argv[2])"
    return _pipe(ctx, lambda cmd, a: [PY, "-c", code, ctx.model, cmd])


@probe("pipe-wav-scp-kept", "BAD", "a data dir's wav.scp pipe ('cmd |', Kaldi's) is still run (verify --data)")
def _(ctx: Ctx) -> tuple[str, str]:
    a, b = ctx.voice(ctx.work / "a.wav"), ctx.voice(ctx.work / "b.wav")
    d = ctx.work / "data"
    d.mkdir()
    (d / "wav.scp").write_text(f"s1-a cat {a} |\ns2-b {b}\n")
    (d / "utt2spk").write_text("s1-a s1\ns2-b s2\n")
    (d / "spk2utt").write_text("s1 s1-a\ns2 s2-b\n")
    p = ctx.spk("verify", "--model", ctx.model, "--data", d, "s1-a", "s2-b")
    ok = p.returncode == 0 and '"score"' in p.stdout
    return ("OK" if ok else "BAD"), (f"scored: {p.stdout.strip()[:120]}" if ok else said(p))


@probe(
    "pipe-make-data-dir-list", "BAD", "make_data_dir --list: a file named 'touch x; cat a.wav |' becomes a wav.scp pipe"
)
def _(ctx: Ctx) -> tuple[str, str]:
    name = "touch pwned; cat a.wav |"
    ctx.voice(ctx.work / name, fmt={"format": "WAV"})
    ctx.voice(ctx.work / "b.wav")
    (ctx.work / "files.txt").write_text(f"{name}\tann\nb.wav\tann\n")
    p = ctx.spk("make_data_dir", "--list", "files.txt", "d", "--skip-bad", "true")
    wav = (ctx.work / "d" / "wav.scp").read_text() if (ctx.work / "d" / "wav.scp").is_file() else ""
    if any(line.rstrip().endswith("|") for line in wav.splitlines()):
        return "BAD", f"wav.scp holds the command: {next(ln for ln in wav.splitlines() if ln.rstrip().endswith('|'))!r}"
    return "OK", f"no command in wav.scp; {tail(p, 3).split(' | ')[0]}"


# ----------------------------------------------------------------------------- diarization outputs


@probe("diarize-overwrites", "BAD", "diarize --out DIR replaces a user's own DIR/<stem>.rttm")
def _(ctx: Ctx) -> tuple[str, str]:
    a = ctx.voice(ctx.work / "a.wav", 6.0)
    out = ctx.work / "o"
    out.mkdir()
    (out / "a.rttm").write_text("my own notes\n")
    p = ctx.spk("diarize", "--model", ctx.model, "--out", out, a)
    if (out / "a.rttm").read_text() != "my own notes\n":
        return "BAD", f"the user's a.rttm was replaced; {said(p)}"
    return "OK", f"kept; {said(p)}"


@probe("rttm-recording-id", "BAD", "a recording 'my meeting.flac' gives an 11-field RTTM line")
def _(ctx: Ctx) -> tuple[str, str]:
    a = ctx.voice(ctx.work / "my meeting.flac", 6.0)
    p = ctx.spk("diarize", "--model", ctx.model, "--out", "o", a)
    lines = [ln for f in sorted((ctx.work / "o").glob("*.rttm")) for ln in f.read_text().splitlines()]
    bad = [ln for ln in lines if len(ln.split()) != 10]
    if bad:
        return "BAD", f"{len(bad)} of {len(lines)} lines without 10 fields, e.g. {bad[0]!r}"
    if p.returncode:
        return "OK", f"refused: {said(p)}"
    return "OK", f"{len(lines)} lines of 10 fields, e.g. {lines[0] if lines else '(none)'!r}; {tail(p)}"


@probe("diarize-out-is-a-file", "WEAK", "diarize --out FILE says '[Errno 17]'")
def _(ctx: Ctx) -> tuple[str, str]:
    (ctx.work / "o").write_text("a file\n")
    p = ctx.spk("diarize", "--model", ctx.model, "--out", "o", ctx.voice(ctx.work / "a.wav", 6.0))
    weak = p.returncode == 0 or "Errno" in p.stderr or "Traceback" in p.stderr
    return ("WEAK" if weak else "OK"), said(p)


@probe("diarize-missing-file-late", "WEAK", "a missing file is found only after earlier RTTMs were written")
def _(ctx: Ctx) -> tuple[str, str]:
    a = ctx.voice(ctx.work / "a.wav", 6.0)
    p = ctx.spk("diarize", "--model", ctx.model, "--out", "o", a, ctx.work / "missing.wav")
    written = sorted(f.name for f in (ctx.work / "o").glob("*.rttm")) if (ctx.work / "o").is_dir() else []
    if written:
        return "WEAK", f"{written} written before the refusal; {said(p)}"
    return ("OK" if p.returncode else "WEAK"), f"nothing written; {said(p)}"


@probe("diarize-num-speakers-1000", "WEAK", "--num-speakers 1000 on one speaker gives 11 silently")
def _(ctx: Ctx) -> tuple[str, str]:
    a = ctx.voice(ctx.work / "a.wav", 8.0)
    p = ctx.spk("diarize", "--model", ctx.model, "--out", "o", "--num-speakers", 1000, a)
    if p.returncode:
        return "OK", f"refused: {said(p)}"
    warned = "WARNING" in p.stderr or "1000" in p.stderr
    return ("OK" if warned else "WEAK"), tail(p, 2)


@probe("diarize-speech-past-end", "WEAK", "--speech turns past the recording's end are accepted silently")
def _(ctx: Ctx) -> tuple[str, str]:
    a = ctx.voice(ctx.work / "a.wav", 4.0)
    (ctx.work / "sp.rttm").write_text("SPEAKER a 1 0.50 20.00 <NA> <NA> s1 <NA> <NA>\n")
    p = ctx.spk("diarize", "--model", ctx.model, "--out", "o", "--speech", ctx.work / "sp.rttm", a)
    if p.returncode:
        return "OK", f"refused: {said(p)}"
    warned = "WARNING" in p.stderr and ("end" in p.stderr or "past" in p.stderr)
    return ("OK" if warned else "WEAK"), f"accepted: {tail(p)}"


@probe("read-rttm-9-fields", "WEAK", "read_rttm takes a 9-field SPEAKER line")
def _(ctx: Ctx) -> tuple[str, str]:
    (ctx.work / "r.rttm").write_text("SPEAKER rec 1 0.00 1.00 <NA> <NA> s1 <NA>\n")
    code = "import sys\nfrom spkflow.diar.rttm import read_rttm\nprint(len(read_rttm(sys.argv[1]).turns))"
    p = ctx.run([PY, "-c", code, ctx.work / "r.rttm"])
    if p.returncode == 0:
        return "WEAK", f"read: {p.stdout.strip()} turn(s)"
    return ("WEAK" if "Traceback" in p.stderr and "InputError" not in p.stderr else "OK"), tail(p)


# ----------------------------------------------------------------------------- shards


def _shards(ctx: Ctx) -> tuple[Path, Path]:
    data = ctx.speakers("train", 3, 4, 2.0)
    feats = ctx.work / "feats"
    p = ctx.run(["bash", ROOT / "scripts/feats/make_fbank.sh", "--nj", 1, data, feats])
    if p.returncode:
        raise RuntimeError(f"make_fbank.sh: {tail(p)}")
    out = feats / "shards"
    p = ctx.run(["bash", ROOT / "scripts/feats/make_shards.sh", "--nj", 1, "--shard-utts", 4, feats, out])
    if p.returncode:
        raise RuntimeError(f"make_shards.sh: {tail(p)}")
    return feats, out


def _read_all(ctx: Ctx, shard_list: Path) -> subprocess.CompletedProcess:
    """Every shard loaded as training's shard stores load it (ShardSet.load: every member indexed
    and checked)."""
    code = (
        "import sys\nfrom spkflow.data.shards import ShardSet\n"
        "s = ShardSet(sys.argv[1])\n"
        "for i in range(len(s)):\n"
        "    s.load(i)\n"
        "print('read', len(s), 'shards')\n"
    )
    return ctx.run([PY, "-c", code, shard_list])


@probe("shard-flipped-bytes", "BAD", "1,000 flipped bytes in a feats_voiced member: rerun keeps it, training reads it")
def _(ctx: Ctx) -> tuple[str, str]:
    feats, out = _shards(ctx)
    shard = sorted(out.glob("shard.*.tar"))[0]
    with tarfile.open(shard) as t:
        m = next(m for m in t.getmembers() if m.name.endswith(".feats_voiced"))
    raw = bytearray(shard.read_bytes())
    lo = m.offset_data + m.size // 4
    n = min(1000, m.size // 2)
    raw[lo : lo + n] = bytes(b ^ 0xFF for b in raw[lo : lo + n])
    shard.write_bytes(bytes(raw))
    p = ctx.run(["bash", ROOT / "scripts/feats/make_shards.sh", "--nj", 1, "--shard-utts", 4, feats, out])
    kept = shard.read_bytes() == bytes(raw)
    r = _read_all(ctx, out / "shards.list")
    named = m.name.rsplit(".", 1)[0] in (p.stderr + r.stderr) or shard.name in (p.stderr + r.stderr)
    if kept and p.returncode == 0 and r.returncode == 0:
        return "BAD", f"rerun exit 0 and kept the flipped {m.name}; reading it: {said(r)}"
    if kept and r.returncode == 0:
        return "BAD", f"rerun: {said(p)}; training reads the flipped member: {said(r)}"
    return ("OK" if named else "WEAK"), f"rerun: {said(p)}; reading: {said(r)}"


@probe("shard-truncated-rerun", "BAD", "a truncated shard: make_shards rerun writes shards.list with the cut size")
def _(ctx: Ctx) -> tuple[str, str]:
    feats, out = _shards(ctx)
    shard = sorted(out.glob("shard.*.tar"))[0]
    whole = shard.stat().st_size
    with open(shard, "r+b") as f:
        f.truncate(whole // 2)
    p = ctx.run(["bash", ROOT / "scripts/feats/make_shards.sh", "--nj", 1, "--shard-utts", 4, feats, out])
    listed = {ln.split()[0]: int(ln.split()[2]) for ln in (out / "shards.list").read_text().splitlines() if ln}
    size = listed.get(shard.name)
    if size == whole // 2 and p.returncode == 0:
        return "BAD", f"shards.list now says {size} bytes (cut from {whole}); {said(p)}"
    return "OK", f"shards.list says {size} of {whole} bytes; {said(p)}"


@probe("make-shards-nj-0", "WEAK", "make_shards.sh --nj 0 ends in grep errors")
def _(ctx: Ctx) -> tuple[str, str]:
    data = ctx.speakers("train", 2, 2, 1.5)
    feats = ctx.work / "feats"
    q = ctx.run(["bash", ROOT / "scripts/feats/make_fbank.sh", "--nj", 1, data, feats])
    if q.returncode:
        return "SKIP", f"make_fbank.sh: {tail(q)}"
    p = ctx.run(["bash", ROOT / "scripts/feats/make_shards.sh", "--nj", 0, feats, feats / "shards"])
    weak = p.returncode == 0 or "grep" in p.stderr or "nj" not in p.stderr
    return ("WEAK" if weak else "OK"), said(p)


@probe("load-shard-directory", "WEAK", "load_shard on a directory raises a raw IsADirectoryError")
def _(ctx: Ctx) -> tuple[str, str]:
    code = "import sys\nfrom spkflow.data.shards import load_shard\nload_shard(sys.argv[1])"
    p = ctx.run([PY, "-c", code, ctx.work])
    weak = p.returncode == 0 or "IsADirectoryError" in p.stderr
    return ("WEAK" if weak else "OK"), tail(p)


# ----------------------------------------------------------------------------- a new user's corpus, stops


@probe(
    "template-run-sh-supervised",
    "BAD",
    "the run.sh setup.sh writes does not source the supervisor (kill leaves training)",
)
def _(ctx: Ctx) -> tuple[str, str]:
    p = ctx.run(["bash", ROOT / "egs/TEMPLATE/spk1/setup.sh", ctx.work / "mine" / "spk1"])
    if p.returncode:
        return "BAD", f"setup.sh: {said(p)}"
    text = (ctx.work / "mine" / "spk1" / "run.sh").read_text()
    ok = "supervise.sh" in text
    return ("OK" if ok else "BAD"), ("run.sh sources utils/supervise.sh" if ok else "no supervise.sh in run.sh")


@probe("split-one-folder", "WEAK", "no way to split one folder into train and test (by speaker)")
def _(ctx: Ctx) -> tuple[str, str]:
    p = ctx.spk("make_data_dir", "--help")
    ok = "--split" in p.stdout
    return ("OK" if ok else "WEAK"), ("make_data_dir --split exists" if ok else "make_data_dir has no --split")


@probe("make-trials-size", "WEAK", "make_trials' default on 4,000 files makes ~800 k target pairs")
def _(ctx: Ctx) -> tuple[str, str]:
    d = ctx.work / "d"
    d.mkdir()
    utts = [(f"s{s:02d}-u{u:03d}", f"s{s:02d}") for s in range(20) for u in range(200)]
    (d / "utt2spk").write_text("".join(f"{u} {s}\n" for u, s in utts))
    p = ctx.spk("make_trials", d, d / "trials")
    if p.returncode:
        return "OK", f"refused: {said(p)}"
    n = sum(1 for ln in (d / "trials").read_text().splitlines() if ln.endswith(" target"))
    return ("WEAK" if n > 100_000 else "OK"), f"{n:,} target pairs from 4,000 files of 20 speakers; {tail(p)}"


@probe("shards-num-spk-vs-speakers", "WEAK", "--num_spk 32 on 20 speakers says 'raise the pool or lower N, M'")
def _(ctx: Ctx) -> tuple[str, str]:
    code = (
        "from spkflow.train.shard_plan import plan_shard_epoch\n"
        "spk2utt = {f's{s:02d}': [f's{s:02d}-u{u}' for u in range(10)] for s in range(20)}\n"
        "u2s = {u: f'shard.{i % 4}' for i, u in enumerate(x for v in spk2utt.values() for x in v)}\n"
        "plan_shard_epoch(spk2utt, u2s, 32, 2, 0, 1)\n"
    )
    p = ctx.run([PY, "-c", code])
    if p.returncode == 0:
        return "WEAK", "planned without a word"
    weak = "raise the pool" in p.stderr and "speakers" not in tail(p).split("raise the pool")[0]
    return ("WEAK" if weak else "OK"), tail(p)


def _alive_in_session(sid: int) -> list[int]:
    """Pids of the live processes of session ``sid`` (zombies left out)."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                out.append(int(d.name))
    return out


def _end_session(sid: int) -> None:
    """SIGKILL what is left of a run this probe started (its own session)."""
    for pid in _alive_in_session(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _recipe(ctx: Ctx, num_spk: int, num_utt: int, seconds: float) -> tuple[Path, list[str]]:
    """A recipe made by egs/TEMPLATE/spk1/setup.sh over folders of synthetic speech, and its options."""
    src = ctx.work / "rec"
    for s in range(num_spk):
        for u in range(num_utt):
            ctx.voice(src / f"spk{s:02d}" / f"u{u}.wav", seconds)
    rec = ctx.work / "mine" / "spk1"
    p = ctx.run(["bash", ROOT / "egs/TEMPLATE/spk1/setup.sh", rec])
    if p.returncode:
        raise RuntimeError(f"setup.sh: {tail(p)}")
    return rec, ["--local_data_opts", f"--train_dir {src} --test_dir {src}", "--nj", "2"]


def _start(ctx: Ctx, rec: Path, args: list[str]) -> tuple[subprocess.Popen, Path]:
    log = ctx.work / "run.out"
    with open(log, "w") as f:
        proc = subprocess.Popen(["./run.sh", *map(str, args)], cwd=rec, env=ctx.env(), stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    return proc, log


_A_BATCH = re.compile(r"epoch \d+: +\d+%\|[^|]*\| *[1-9]\d*/\d+")  # training has finished a batch


def _wait_for(proc: subprocess.Popen, rec: Path, seconds: float, also: Callable[[], bool] = lambda: False) -> bool:
    """Until training finished a batch, ``also()`` holds or the run ended; False after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None or also():
            return True
        if any(_A_BATCH.search(f.read_text(errors="replace")) for f in rec.glob("exp/*/train.log")):
            return True
        time.sleep(1)
    return False


@probe("template-defaults-vs-corpus", "WEAK", "the template's 200-300-frame crops run on 1-second clips silently", True)
def _(ctx: Ctx) -> tuple[str, str]:
    rec, opts = _recipe(ctx, 20, 6, 1.0)
    proc, log = _start(ctx, rec, ["--stage", 1, "--stop_stage", 4, "--num_spk", 8, "--num_utt", 2, *opts])
    said_so = re.compile(r"(crop|voiced)[^\n]*(frames|seconds|longer|shorter)", re.I)
    try:
        _wait_for(proc, rec, 1800, lambda: bool(said_so.search(log.read_text(errors="replace"))))
    finally:
        _end_session(proc.pid)
    text = log.read_text(errors="replace")
    m = said_so.search(text)
    if m:
        return "OK", text[text.rfind("\n", 0, m.start()) + 1 :].splitlines()[0][:300]
    return (
        "WEAK",
        f"no word of the crops against ~1 s clips (exit {proc.poll()}): {text.strip().splitlines()[-1][:200]}",
    )


@probe("sigterm-run-sh", "BAD", "SIGTERM to run.sh in training: all stops, the checkpoint written, in one grace", True)
def _(ctx: Ctx) -> tuple[str, str]:
    rec, opts = _recipe(ctx, 8, 6, 2.0)
    p = ctx.run(["./run.sh", "--stage", 1, "--stop_stage", 3, "--num_spk", 4, "--num_utt", 2, *opts], cwd=rec,
                timeout=1800)  # fmt: skip
    if p.returncode:
        return "SKIP", f"stages 1-3: {tail(p)}"
    proc, log = _start(ctx, rec, ["--stage", 4, "--stop_stage", 4, "--num_spk", 4, "--num_utt", 2, *opts])
    try:
        if not _wait_for(proc, rec, 1200) or proc.poll() is not None:
            return "SKIP", f"training did not finish a batch while running (exit {proc.poll()})"
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            return "BAD", "run.sh still running 300 s after SIGTERM"
        took = time.monotonic() - t0
        time.sleep(1)
        left = _alive_in_session(proc.pid)
    finally:
        _end_session(proc.pid)
    if left:
        return "BAD", f"{len(left)} process(es) of the run (training) still alive after run.sh ended on SIGTERM"
    ckpt = list(rec.glob("exp/*/checkpoint.pth"))
    grade = "OK" if ckpt and took < 10 else "WEAK"
    return grade, f"ended {took:.1f} s after SIGTERM; checkpoint.pth {'written' if ckpt else 'absent'}"


# ----------------------------------------------------------------------------- the WEAK answers


@probe("permission-denied", "WEAK", 'a chmod 000 file: "System error"')
def _(ctx: Ctx) -> tuple[str, str]:
    as_user: list[str] = []
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            return "SKIP", "root reads any file and setpriv is missing"
        as_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    d = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        os.chmod(d, 0o755)
        f = ctx.voice(d / "locked.wav")
        os.chmod(f, 0)
        code = "import sys\nfrom spkflow.data.audio import read_audio\nread_audio(sys.argv[1])"
        p = ctx.run([*as_user, PY, "-c", code, f], cwd=d)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    ok = "permission denied" in p.stderr.lower() and str(f) in p.stderr
    return ("OK" if ok else "WEAK"), tail(p)


@probe("directory-as-file", "WEAK", 'a directory given as an audio FILE: "Format not recognised"')
def _(ctx: Ctx) -> tuple[str, str]:
    (ctx.work / "d.wav").mkdir()
    p = ctx.spk("verify", "--model", ctx.model, ctx.work / "d.wav", ctx.voice(ctx.work / "a.wav"))
    ok = p.returncode == 1 and "directory" in p.stderr
    return ("OK" if ok else "WEAK"), tail(p)


@probe("non-utf8-name", "WEAK", "a non-UTF-8 file name is blamed on the audio header")
def _(ctx: Ctx) -> tuple[str, str]:
    src = ctx.work / "rec"
    for u in range(2):
        ctx.voice(src / "ann" / f"u{u}.wav")
    ctx.voice(bytes(src) + b"/ann/caf\xe9.wav")
    p = ctx.spk("make_data_dir", src, ctx.work / "d")
    v = ctx.spk("verify", "--model", ctx.model, os.fsdecode(bytes(src) + b"/ann/caf\xe9.wav"), src / "ann" / "u0.wav")
    blamed = "header" in p.stderr or "header" in v.stderr or v.returncode
    return ("WEAK" if blamed else "OK"), f"make_data_dir: {tail(p)}; verify: exit {v.returncode}"


@probe("data-dir-mode", "WEAK", "new data dirs are drwx------ (not the umask's)")
def _(ctx: Ctx) -> tuple[str, str]:
    src = ctx.work / "rec"
    for u in range(2):
        ctx.voice(src / "ann" / f"u{u}.wav")
    p = ctx.run([PY, "-m", "spkflow.bin.make_data_dir", src, ctx.work / "d"], preexec_fn=lambda: os.umask(0o022))
    if p.returncode:
        return "WEAK", said(p)
    mode = (ctx.work / "d").stat().st_mode & 0o777
    return ("OK" if mode == 0o755 else "WEAK"), f"umask 022 -> {mode:o}"


@probe("truncated-mp3-verify", "WEAK", "a truncated mp3 is decided in verify with no note")
def _(ctx: Ctx) -> tuple[str, str]:
    mp3 = ctx.voice(ctx.work / "cut.mp3", 4.0, fmt={"format": "MP3", "subtype": "MPEG_LAYER_III"})
    raw = mp3.read_bytes()
    mp3.write_bytes(raw[: len(raw) // 2])
    p = ctx.spk("verify", "--model", ctx.model, mp3, ctx.voice(ctx.work / "a.wav"))
    try:
        row = json.loads(p.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return ("OK" if p.returncode and "truncated" in p.stderr else "WEAK"), said(p)
    noted = "truncated" in json.dumps(row) or "truncated" in p.stderr
    return ("OK" if noted else "WEAK"), (row.get("note") or tail(p))


@probe("long-clip-memory", "WEAK", "a 10-minute clip peaks at 1.7 GB in verify")
def _(ctx: Ctx) -> tuple[str, str]:
    import numpy as np
    import soundfile as sf

    from helpers.audio import synth_voice

    rng = np.random.default_rng(0)
    x = np.concatenate([synth_voice(rng, 100 + i, (500.0, 1500.0, 2500.0), 10.0) for i in range(60)])
    sf.write(ctx.work / "long.wav", x, 16000, subtype="PCM_16")
    a = ctx.voice(ctx.work / "a.wav")
    rss = {}  # VmHWM: the process's own peak (ru_maxrss would count this process's size at the fork)
    for name, f in (("short", a), ("long", ctx.work / "long.wav")):
        code = (
            "import re, runpy, sys\nsys.argv = ['verify', '--progress', 'false', '--model'] + sys.argv[1:]\n"
            "try:\n    runpy.run_module('spkflow.bin.verify', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1), file=sys.stderr)\n"
        )
        p = ctx.run([PY, "-c", code, ctx.model, f, a])
        rss[name] = int(p.stderr.strip().splitlines()[-1]) / 1024
    extra = rss["long"] - rss["short"]
    grade = "OK" if extra < 600 else "WEAK"
    return grade, f"peak {rss['long']:.0f} MB, {extra:.0f} MB above two short files ({rss['short']:.0f} MB)"


@probe("pack-member-names", "WEAK", "a pack with '../' or absolute member names passes pack --check")
def _(ctx: Ctx) -> tuple[str, str]:
    import zipfile

    if not zipfile.is_zipfile(ctx.model):
        return "SKIP", f"{ctx.model} is not a pack"
    bad = ctx.work / "bad.zip"
    shutil.copy(ctx.model, bad)
    with zipfile.ZipFile(bad, "a") as z:
        z.writestr(zipfile.ZipInfo("../evil.sh"), b"echo pwned\n")
    p = ctx.spk("pack", "--check", bad)
    return ("WEAK" if p.returncode == 0 else "OK"), tail(p)


def _damaged_gallery(ctx: Ctx, damage: Callable[[dict], None], named: str) -> tuple[str, str]:
    """A saved enrolment (identify --save) changed by ``damage`` (its arrays by name), then used:
    OK when identify refuses it naming the file and ``named``."""
    import numpy as np

    enrol = ctx.speakers("enrol", 2, 2)
    g = ctx.work / "g.npz"
    p = ctx.spk("identify", "--model", ctx.model, "--enrol", enrol, "--save", g)
    if p.returncode:
        raise RuntimeError(f"identify --save: {tail(p)}")
    with np.load(g) as z:
        parts = {k: z[k] for k in z.files}
    damage(parts)
    np.savez(g, **parts)
    p = ctx.spk("identify", "--model", ctx.model, "--gallery", g, ctx.voice(ctx.work / "t.wav"))
    ok = p.returncode == 1 and str(g) in p.stderr and named in p.stderr
    return ("OK" if ok else "WEAK"), said(p)


@probe("gallery-nan", "WEAK", "a gallery (identify --save) with NaN is not named")
def _(ctx: Ctx) -> tuple[str, str]:
    import numpy as np

    def nan(parts: dict) -> None:
        parts["emb"][1, 0] = np.nan

    return _damaged_gallery(ctx, nan, "NaN")


@probe("gallery-dimension", "WEAK", "a gallery of the wrong dimension is not named")
def _(ctx: Ctx) -> tuple[str, str]:
    return _damaged_gallery(ctx, lambda parts: parts.update(emb=parts["emb"][:, :-3]), "dimension")


@probe("bench-fuse3-missing", "WEAK", "bench_slow_storage.py without fuse3: a raw FileNotFoundError 'fusermount3'")
def _(ctx: Ctx) -> tuple[str, str]:
    bench = ROOT / "test/bench/bench_slow_storage.py"
    if not bench.is_file():
        return "SKIP", "no bench_slow_storage.py"
    bare = ctx.work / "bin"  # this PATH's commands without fusermount3
    bare.mkdir()
    for d in ctx.env()["PATH"].split(os.pathsep):
        with contextlib.suppress(OSError):
            for f in os.scandir(d):
                if not f.name.startswith("fusermount") and not (bare / f.name).exists() and os.access(f.path, os.X_OK):
                    (bare / f.name).symlink_to(f.path)
    env = dict(ctx.env(), PATH=str(bare))
    cmd = [PY, bench, "--json", ctx.work / "o.json", "--work", ctx.work / "w", "--no-vox-coverage"]
    proc = subprocess.Popen(list(map(str, cmd)), env=env, cwd=ctx.work, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return "WEAK", "no fuse3 check first: still preparing its data 120 s later, the mount comes after"
    p = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if ("corpora" in err or "db.sh" in err) and "fuse" not in err.lower():
        return "SKIP", f"the bench needs its corpus: {tail(p)}"
    raw = "FileNotFoundError" in err and "fusermount3" in err
    return ("WEAK" if raw or proc.returncode == 0 else "OK"), said(p)


# ----------------------------------------------------------------------------- the runner


def make_model(root: Path) -> Path:
    """A tiny ECAPA with random weights, packed (what --model would be)."""
    from helpers.models import make_spkflow_model_dir

    d = make_spkflow_model_dir(root / "tiny_model")
    pack = root / "tiny_model.zip"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run([PY, "-m", "spkflow.bin.pack", "--model-dir", d, "--out", pack], env=env, check=True,
                   capture_output=True)  # fmt: skip
    return pack


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="a packed model or model dir (default: a tiny random one)")
    ap.add_argument("--only", nargs="*", default=None, metavar="NAME", help="run these probes only")
    ap.add_argument("--slow", action="store_true", help="also the slow probes (recipe runs, training)")
    ap.add_argument("--list", action="store_true", help="list the probes and exit")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (its path is printed)")
    args = ap.parse_args()
    if args.list:
        for p in PROBES:
            print(f"{p.name:28s} {p.grade:4s} {'(slow) ' if p.slow else ''}{p.what}")
        return 0
    chosen = [p for p in PROBES if args.only is None or p.name in args.only]
    unknown = set(args.only or ()) - {p.name for p in PROBES}
    if unknown:
        print(f"unknown probe(s): {', '.join(sorted(unknown))} (--list)", file=sys.stderr)
    root = Path(tempfile.mkdtemp(prefix="spkflow-probes."))
    counts: dict[str, int] = {}
    try:
        model = Path(args.model).resolve() if args.model else make_model(root)
        print(f"# probes of {ROOT} (git {_head()}), model {model}; load average {os.getloadavg()[0]:.1f}")
        for p in chosen:
            ctx = Ctx(root, model, work=root / p.name)
            ctx.work.mkdir()
            t0 = time.monotonic()
            if p.slow and not args.slow:
                status, evidence = "SKIP", "slow: --slow runs it"
            else:
                try:
                    status, evidence = p.run(ctx)
                except Exception as exc:  # noqa: BLE001  (a probe that cannot run is reported, not raised)
                    status = "SKIP"
                    evidence = f"the probe could not run: {type(exc).__name__}: {exc}"
                    if os.environ.get("PROBES_DEBUG"):
                        traceback.print_exc()
            counts[status] = counts.get(status, 0) + 1
            print(f"{status:4s}  {p.name:28s} ({p.grade} in the round) {evidence}  [{time.monotonic() - t0:.0f} s]")
            sys.stdout.flush()
    finally:
        if args.keep:
            print(f"# kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    print("# " + ", ".join(f"{k} {counts.get(k, 0)}" for k in ("OK", "WEAK", "BAD", "SKIP")) + f" of {len(chosen)}")
    return 0


def _head() -> str:
    p = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h"], capture_output=True, text=True)
    return p.stdout.strip() or "?"


if __name__ == "__main__":
    sys.exit(main())
