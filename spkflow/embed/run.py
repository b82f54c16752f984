"""Speaker-embedding extraction (stage 5): batched, parallel, resumable, exact.

One extraction = ``--nj`` independent jobs (processes started by ``run.pl`` / ``queue.pl`` /
``slurm.pl``, one GPU each with ``--gpu 1``), then one merge.  Inside a job
(:func:`run_job`): DataLoader worker *processes* read and resample the audio (and compute
features and pad the batch for spkflow models; page-locked memory on CUDA; :mod:`spkflow.embed.loader`),
batches are formed by length under a bound on padded frames, the model runs with lengths, and
every batch is committed to the job's ark + scp in order (for spkflow models, while the device
computes the next one: :meth:`~spkflow.embed.native.SpkflowEmbedder.launch_padded`).
:func:`merge_embeddings` checks the union of the jobs' outputs against the
data dir and writes ``xvector.{ark,scp}`` and ``spk_xvector.{ark,scp}`` (float32 Kaldi
vectors, read by ``kaldiio`` and by ESPnet's ``ESPnetDataset`` type ``kaldi_ark``).

What it guarantees
------------------
* **Batched = alone, bounded batches:** see :mod:`spkflow.embed.base` (spkflow models),
  :mod:`spkflow.embed.masking` and the toolkits' modules (:mod:`~spkflow.embed.espnet`,
  :mod:`~spkflow.embed.speechbrain`, :mod:`~spkflow.embed.wespeaker`,
  :mod:`~spkflow.embed.resemblyzer`; their encoders do not honour lengths), and docs/toolkits.md.
* **Keys in data-dir order.**  Outputs are written in ``utt2spk`` order, which must be
  ``LC_ALL=C`` sorted (checked).  The merge fails, listing them, when a data-dir utterance has
  no embedding or an embedding has no utterance.
* **Resumable, never complete-looking when incomplete.**  A job appends each batch to its own
  ark (a new ark per attempt) and only then appends the batch's keys to its commit log
  ``xvector.JOB.scp`` (both fsync'ed).  A killed job leaves at most an unreferenced tail; the
  next run reads every commit log, computes only the missing utterances, and the merge writes
  exactly one embedding per utterance (:mod:`spkflow.data.jobs`).
* **One model per output dir.**  Each job attempt records its model's stamp (toolkit, SHA-256
  of config and weights) beside its ark; a job refuses a job dir stamped with another model,
  and the merge refuses parts whose stamps differ from ``jobs/model.stamp``, naming them.
  ``extract_embeddings.sh`` holds the output dir's lock (:mod:`spkflow.core.lock`) from the first
  check to the merge, so a second extraction into the same dir is refused, naming the first.
* **All or nothing.**  ``xvector.{ark,scp}``, ``spk_xvector.{ark,scp}``, ``bad_utts`` and
  ``bad_spks`` appear together, ``xvector.scp`` last, or none does (a full disk included: one
  line naming the file).  DataLoader workers die with their job (:mod:`spkflow.core.procs`).
* **Bad input.**  An unreadable utterance fails its job with an error naming it and its source
  (or, with ``skip_bad``, is listed in ``OUT_DIR/bad_utts`` with the reason and left out); a
  speaker all of whose utterances failed is reported in ``OUT_DIR/bad_spks`` and gets no mean,
  never a mean over nothing.  A model dir without ``config.yaml`` or without weights, or a
  truncated or code-holding weights file, is refused by name.
* **Speaker means** (``spk_xvector.scp``) average the *raw* utterance vectors, as ESPnet's
  ``extract_xvectors.py`` / ``extract_spk_embed.py`` do (``np.mean`` of the embeddings); ESPnet's
  TTS models L2-normalise ``spembs`` on input (``F.normalize`` in Tacotron2, FastSpeech2, ...),
  so the files are drop-in replacements.  ``spk_mean="l2"`` averages L2-normalised vectors
  instead (each utterance weighs the same whatever its norm).

Anchors and what we do better
-----------------------------
ESPnet's ``egs2/TEMPLATE/asr1/pyscripts/utils/extract_spk_embed.py`` (sequential, and since
2025 with a thread pool) and ``extract_spk_embed_parallel.py``, with
``egs2/TEMPLATE/tts1/scripts/utils/sort_spk_embed_scp.sh``.  Those use *threads* in one process
on one device (the GIL and one model bound them; no ``--nj``, no cluster); they zero-pad a
batch and call the model without ``speech_lengths`` (padded utterances get other embeddings);
they write keys in completion order (``as_completed``), hence the separate sort script, which
hard-codes set names (``train``/``val`` under ``raw/org``), needs a ``text`` file, sorts the
data dir's files in place, and replaces the scp *before* checking it; their test uses
equal-length utterances, so the padding bug cannot show.  They cannot resume (one unreadable
file aborts the run and everything is recomputed), write the ark non-atomically, silently fall
back to CPU when CUDA is missing, and load weights with ``torch.load(weights_only=False)``
and ``strict=False`` (a checkpoint that does not fit the config loads without a word).
Here: parallel processes through ``$cmd`` (nj x GPUs), lengths honoured, keys in data-dir
order with a missing/extra check, resume, atomic outputs, no hard-coded set names, weights
loaded with ``weights_only=True`` and every non-loss key checked.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from spkflow.core.atomic import atomic_write, write_text_atomic
from spkflow.core.batch_wait import LOADER_BOUND, BatchWait
from spkflow.core.errors import InputError, UtteranceError
from spkflow.data.datadir import DataDir
from spkflow.data.jobs import (
    CommitLog,
    MergeError,
    StagedOutputs,
    check_stamps,
    missing_and_extra,
    read_commit_log,
    read_stamp,
    show_keys,
    writing,
)
from spkflow.data.jobs import committed_entries as _committed
from spkflow.data.tables import check_sorted_unique, read_keys, read_kv_lines
from spkflow.embed.base import Embedder, PendingEmbeddings, split_by_frames
from spkflow.embed.loader import job_loader

__all__ = [
    "data_dir_keys",
    "read_commit_log",
    "committed_entries",
    "JobWriter",
    "JobSummary",
    "run_job",
    "MergeError",
    "MergeReport",
    "merge_embeddings",
    "speaker_means",
    "read_vectors",
    "write_vectors",
    "align_scp",
    "MODEL_STAMP",
]

log = logging.getLogger("spkflow.embed.run")

#: commit logs and arks of the jobs inside the job dir
_PREFIX = "xvector"
_COMMIT_GLOB = "xvector.*.scp"
_BAD_GLOB = "bad_utts.*"
#: the job dir's stamp of the model its embeddings come from (written by extract_embeddings.sh)
MODEL_STAMP = "model.stamp"
#: every file the merge writes in the output dir, in publishing order (xvector.scp last)
MERGED_FILES = ("spk_xvector.ark", "spk_xvector.scp", "bad_utts", "bad_spks", "xvector.ark", "xvector.scp")


# =============================================================================== data dir


def data_dir_keys(data_dir: str | os.PathLike[str]) -> tuple[list[str], dict[str, list[str]]]:
    """Utterances (``utt2spk`` order) and ``spk -> [utts]`` of a data dir.

    ``utt2spk`` must be sorted and unique in ``LC_ALL=C`` order (InputError at the first bad
    line); ``spk2utt`` is read when present (else derived from ``utt2spk``) and must list the
    same utterances.
    """

    d = DataDir(data_dir)
    utt2spk_path = d.file("utt2spk")
    if not utt2spk_path.is_file():
        raise InputError(utt2spk_path, None, "no utt2spk: not a Kaldi data directory")
    check_sorted_unique(utt2spk_path)
    utt2spk = d.utt2spk()
    spk2utt = d.spk2utt()
    listed = {u for us in spk2utt.values() for u in us}
    if listed != set(utt2spk):
        only = sorted(set(utt2spk) ^ listed)
        raise InputError(
            d.file("spk2utt"),
            None,
            f"spk2utt and utt2spk list different utterances: {show_keys(only)} (run utils/fix_data_dir.sh)",
        )
    return list(utt2spk), spk2utt


def job_utterances(data_dir: str | os.PathLike[str], keys: str | None = None) -> list[str]:
    """One job's utterances: the first fields of ``keys`` (a split of ``utt2spk``, in its order), or
    every utterance of ``data_dir`` when None; a key the data dir does not hold is an InputError
    naming the keys file."""
    utts, _ = data_dir_keys(data_dir)
    if keys is None:
        return utts
    wanted = read_keys(keys)
    unknown = sorted(set(wanted) - set(utts))
    if unknown:
        raise InputError(keys, None, f"{len(unknown)} key(s) not in {data_dir}/utt2spk, e.g. {unknown[0]!r}")
    return wanted


# =============================================================================== job outputs


def committed_entries(job_dir: str | os.PathLike[str]) -> dict[str, str]:
    """Every committed ``utt -> ark:offset`` in ``job_dir`` (all jobs, all attempts; first wins)."""
    return _committed(job_dir, _COMMIT_GLOB)


class JobWriter(CommitLog):
    """Append-only outputs of one job: ``xvector.JOB.ATTEMPT.ark`` (a new file per attempt, so a
    killed attempt's tail never sits in front of new records), its model stamp
    ``xvector.JOB.ATTEMPT.stamp``, and the commit log ``xvector.JOB.scp``.  :meth:`write` makes
    the vectors durable before it commits their keys."""

    def __init__(self, job_dir: str | os.PathLike[str], job_id: int | str, stamp: str | None = None) -> None:
        super().__init__(job_dir, _PREFIX, job_id, stamp)

    def write(self, items: Sequence[tuple[str, np.ndarray]]) -> None:
        self.commit([(utt, np.ascontiguousarray(vec, dtype=np.float32).reshape(-1)) for utt, vec in items])


def _stamp_of_spec(spec: str) -> str:
    """The stamp file of the ark a committed ``ark:offset`` points into."""
    ark = spec.rpartition(":")[0]
    return ark[: -len(".ark")] + ".stamp" if ark.endswith(".ark") else ark + ".stamp"


@dataclasses.dataclass
class JobSummary:
    total: int
    resumed: int
    computed: int
    bad: dict[str, str]
    #: the job's waits for batches (:meth:`spkflow.core.batch_wait.BatchWait.stats`; empty when nothing ran)
    waits: dict[str, float] = dataclasses.field(default_factory=dict)
    #: its batch slots page-locked on CUDA (:attr:`spkflow.core.shared_batches.PageLocks.report`; empty: none)
    page_locked: dict[str, float] = dataclasses.field(default_factory=dict)


def run_job(
    embedder: Embedder,
    data_dir: str | os.PathLike[str],
    utts: Sequence[str],
    job_dir: str | os.PathLike[str],
    job_id: int | str = 1,
    *,
    batch_size: int = 32,
    max_frames: int = 60000,
    num_workers: int = 1,
    skip_bad: bool = False,
    progress: bool = True,
) -> JobSummary:
    """Embed ``utts`` of ``data_dir`` into ``job_dir`` (see :class:`JobWriter`), skipping those
    already committed by any job.  Raises :class:`UtteranceError` for an unreadable utterance
    unless ``skip_bad`` (then it is listed in ``job_dir/bad_utts.JOB`` with its reason), and
    :class:`InputError` when ``job_dir/model.stamp`` names another model than ``embedder``'s."""
    from tqdm import tqdm

    job_dir = os.fspath(job_dir)
    os.makedirs(job_dir, exist_ok=True)
    stamp = getattr(embedder, "stamp", None)
    expected = read_stamp(os.path.join(job_dir, MODEL_STAMP))
    if stamp is not None and expected is not None and stamp != expected:
        raise InputError(
            os.path.join(job_dir, MODEL_STAMP),
            None,
            f"the job dir holds embeddings of another model ({expected}), not of this one ({stamp}); "
            "is another extraction writing into the same output dir?",
        )
    done = committed_entries(job_dir)
    todo = [u for u in utts if u not in done]
    resumed = len(utts) - len(todo)
    log.info(
        "job %s: %d utterances; %d already done by an earlier run, %d to compute", job_id, len(utts), resumed, len(todo)
    )
    bad: dict[str, str] = {}
    bad_path = os.path.join(job_dir, f"bad_utts.{job_id}")
    if not todo:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(bad_path)
        return JobSummary(len(utts), resumed, 0, bad)
    loader, worker_side = job_loader(
        embedder, data_dir, todo, batch_size=batch_size, max_frames=max_frames, num_workers=num_workers, job_id=job_id
    )
    tty = sys.stderr.isatty()
    computed = 0
    wait = BatchWait()

    def commit(parts: Iterable[tuple[list[str], np.ndarray]]) -> None:
        nonlocal computed
        for keys, vecs in parts:
            keep = []
            finite = np.isfinite(vecs).all(axis=1)
            for utt, v, ok in zip(keys, vecs, finite, strict=True):
                if ok:
                    keep.append((utt, v))
                elif skip_bad:
                    bad[utt] = "the model produced NaN or infinite values"
                    log.warning("skipping utterance '%s': %s", utt, bad[utt])
                else:
                    raise UtteranceError(utt, os.fspath(data_dir), "the model produced NaN or infinite values")
            writer.write(keep)
            computed += len(keep)
        if bad:
            write_text_atomic(bad_path, "".join(f"{u} {r}\n" for u, r in sorted(bad.items())))

    with (
        JobWriter(job_dir, job_id, stamp) as writer,
        tqdm(
            total=len(todo),
            desc=f"job {job_id}",
            unit="utt",
            file=sys.stderr,
            disable=not progress,
            mininterval=0.5 if tty else 10.0,
            ascii=not tty,
        ) as bar,
    ):
        # spkflow models: a batch is queued on the device, then the one before is written while the
        # device computes it (one batch in flight; each is committed whole, in order, as before)
        pending: tuple[int, list[tuple[list[str], PendingEmbeddings]]] | None = None
        for batch in wait.over(loader):
            items = batch[0] if worker_side else [(utt, err) for utt, _, err in batch]
            if worker_side:
                launched = [(keys, embedder.launch_padded(f, n)) for keys, f, n in batch[1]]  # type: ignore[attr-defined]
                if pending is not None:
                    commit((keys, p.result()) for keys, p in pending[1])
                    bar.update(pending[0])
                pending = (len(items), launched)
            for utt, err in items:
                if err is None:
                    continue
                if not skip_bad:
                    raise UtteranceError(utt, err[0], err[1])
                bad[utt] = f"{err[0]}: {err[1]}" if err[0] else err[1]
                log.warning("skipping utterance '%s': %s", utt, bad[utt])
            if not worker_side:
                good = [(utt, x) for utt, x, err in batch if err is None]
                commit(
                    ([u for u, _ in part], embedder.embed([x for _, x in part]))
                    for part in split_by_frames(good, lambda it: embedder.frames(it[1]), max_frames)
                )
                bar.update(len(items))
        if pending is not None:
            commit((keys, p.result()) for keys, p in pending[1])
            bar.update(pending[0])
    if not bad:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(bad_path)
    log.info(
        "job %s: computed %d embeddings (attempt %d), %d bad utterances", job_id, computed, writer.attempt, len(bad)
    )
    waits = wait.stats()
    _report_waits(job_id, waits, str(getattr(embedder, "device", "cpu")), getattr(embedder, "fbank_on", None))
    locks = getattr(loader, "locks", None)
    return JobSummary(len(utts), resumed, computed, bad, waits, dict(locks.report) if locks is not None else {})


def _report_waits(job_id: int | str, waits: dict[str, float], device: str, fbank_on: str | None) -> None:
    """The job's waits for batches (:mod:`spkflow.core.batch_wait`) in its log; on a GPU, a warning
    when the loader, not the model, set the pace."""
    share = waits.get("data_wait_share")
    if share is None:
        return
    log.info(
        "job %s: waited for batches %.0f%% of the time after the first (first batch %.1f s, %.1f s in all)",
        job_id,
        100 * share,
        waits["first_batch_seconds"],
        waits["data_wait_seconds"],
    )
    if device.startswith("cuda") and share > LOADER_BOUND:
        hint = "; --fbank-on device moves the fbank to the GPU" if fbank_on == "workers" else ""
        log.warning(
            "job %s: the model waited for its batches %.0f%% of the time: the loader set the pace "
            "(more --num-workers where CPUs are free%s; docs/gpu.md)",
            job_id,
            100 * share,
            hint,
        )


# =============================================================================== merge


@dataclasses.dataclass
class MergeReport:
    num_utts: int
    num_spks: int
    dim: int
    bad_utts: dict[str, str]
    empty_spks: list[str]
    xvector_scp: str
    spk_xvector_scp: str


def read_vectors(entries: Sequence[tuple[str, str]]) -> list[np.ndarray]:
    """Vectors of ``(key, "ark:offset")`` entries, opening each ark once (order kept)."""
    from kaldiio.matio import read_kaldi

    out: list[np.ndarray | None] = [None] * len(entries)
    by_ark: dict[str, list[tuple[int, int]]] = {}
    for i, (_, spec) in enumerate(entries):
        path, _, off = spec.rpartition(":")
        by_ark.setdefault(path, []).append((int(off), i))
    for path, offs in by_ark.items():
        with open(path, "rb") as f:
            for off, i in sorted(offs):
                f.seek(off)
                try:
                    v = read_kaldi(f)
                except Exception as exc:
                    raise MergeError(f"{path}:{off}: cannot read the vector of '{entries[i][0]}': {exc}") from exc
                out[i] = np.asarray(v, dtype=np.float32).reshape(-1)
    return out  # type: ignore[return-value]


def write_vectors(
    ark: str | os.PathLike[str], scp: str | os.PathLike[str], items: Sequence[tuple[str, np.ndarray]]
) -> None:
    """Write float32 vectors to ``ark`` and ``scp`` atomically, in the given order.

    The old scp is removed first and the new one appears last, so a crash leaves either no
    scp or one that matches its ark."""
    from kaldiio.matio import write_array

    ark, scp = os.fspath(ark), os.fspath(scp)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(scp)
    lines = []
    with writing(ark), atomic_write(ark, "wb", encoding=None) as f:
        for key, vec in items:
            f.write(f"{key} ".encode("utf-8", "surrogateescape"))
            lines.append(f"{key} {ark}:{f.tell()}\n")
            write_array(f, np.ascontiguousarray(vec, dtype=np.float32).reshape(-1))
    with writing(scp), atomic_write(scp, "wb", encoding=None) as f:
        f.write("".join(lines).encode("utf-8", "surrogateescape"))


def _stage_vectors(staged: StagedOutputs, name: str, items: Sequence[tuple[str, np.ndarray]]) -> None:
    """``name.ark`` + ``name.scp`` (pointing at the ark's final path) into ``staged``."""
    from kaldiio.matio import write_array

    ark = staged.path(f"{name}.ark")
    lines = []
    with staged.open(f"{name}.ark", "wb") as f:
        for key, vec in items:
            f.write(f"{key} ".encode("utf-8", "surrogateescape"))
            lines.append(f"{key} {ark}:{f.tell()}\n")
            write_array(f, np.ascontiguousarray(vec, dtype=np.float32).reshape(-1))
    staged.write_text(f"{name}.scp", "".join(lines))


def _read_bad(job_dir: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for p in sorted(Path(job_dir).glob(_BAD_GLOB)):
        for line in Path(p).read_text(encoding="utf-8", errors="surrogateescape").splitlines():
            if line.strip():
                utt, _, reason = line.partition(" ")
                out.setdefault(utt, reason)
    return out


def speaker_means(
    spk2utt: Mapping[str, Sequence[str]], by_utt: Mapping[str, np.ndarray], spk_mean: str = "raw"
) -> tuple[list[tuple[str, np.ndarray]], list[str]]:
    """``spk_xvector`` entries in ``spk2utt`` order: the float32 mean of each speaker's vectors
    in ``by_utt`` (``l2``: of the L2-normalised vectors), computed in float64; and the speakers
    none of whose utterances has a vector."""
    means, empty = [], []
    for spk, members in spk2utt.items():
        vs = [by_utt[u] for u in members if u in by_utt]
        if not vs:
            empty.append(spk)
            continue
        m = np.stack(vs).astype(np.float64)
        if spk_mean == "l2":
            m = m / np.maximum(np.linalg.norm(m, axis=1, keepdims=True), 1e-12)
        means.append((spk, m.mean(axis=0).astype(np.float32)))
    return means, empty


def merge_embeddings(
    data_dir: str | os.PathLike[str],
    job_dir: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    *,
    skip_bad: bool = False,
    spk_mean: str = "raw",
) -> MergeReport:
    """Check the jobs' outputs against the data dir and write the final files.

    Writes ``out_dir/xvector.{ark,scp}`` (one vector per utterance, ``utt2spk`` order),
    ``out_dir/spk_xvector.{ark,scp}`` (mean per speaker, ``spk2utt`` order), and, when there
    are any, ``out_dir/bad_utts`` (``utt reason``, only with ``skip_bad``) and
    ``out_dir/bad_spks`` (speakers left without an embedding).  Raises :class:`MergeError`
    listing the missing and the extra keys when the outputs do not match the data dir, and
    naming the parts when they come from different models (each attempt's stamp against the
    job dir's ``model.stamp``).  The output files appear all together or not at all.
    """
    if spk_mean not in ("raw", "l2"):
        raise ValueError(f"spk_mean must be raw or l2, got {spk_mean!r}")
    job_dir, out_dir = os.fspath(job_dir), os.path.normpath(os.fspath(out_dir))
    utts, spk2utt = data_dir_keys(data_dir)
    have = committed_entries(job_dir)
    bad = {u: r for u, r in _read_bad(job_dir).items() if u not in have}
    missing, extra = missing_and_extra(utts, have)
    missing = [u for u in missing if not (skip_bad and u in bad)]
    if missing or extra:
        msg = [f"embeddings in {job_dir} do not match {os.fspath(data_dir)}/utt2spk:"]
        if missing:
            msg.append(f"  {len(missing)} utterance(s) without an embedding: {show_keys(missing)}")
            failed = [u for u in missing if u in bad]
            if failed:
                msg.append(
                    f"  of which {len(failed)} failed (see {job_dir}/bad_utts.*), e.g. {failed[0]}: {bad[failed[0]]}"
                )
        if extra:
            msg.append(
                f"  {len(extra)} embedding(s) of utterances not in the data dir: {show_keys(extra)} "
                f"(the data dir changed since they were computed? remove {job_dir} to start over)"
            )
        raise MergeError("\n".join(msg))
    present = [u for u in utts if u in have]
    check_stamps(
        {stamp: read_stamp(stamp) for stamp in sorted({_stamp_of_spec(have[u]) for u in present})},
        read_stamp(os.path.join(job_dir, MODEL_STAMP)),
        "models",
        f"remove {job_dir} and extract again",
    )
    vecs = read_vectors([(u, have[u]) for u in present])
    dims = {v.shape[0] for v in vecs}
    if len(dims) > 1:
        raise MergeError(
            f"embeddings in {job_dir} have different sizes {sorted(dims)}: were they made by "
            f"different models? remove {job_dir} to start over"
        )
    for u, v in zip(present, vecs, strict=True):
        if not np.all(np.isfinite(v)):
            raise MergeError(f"{have[u]}: embedding of '{u}' has NaN or infinite values")
    by_utt = dict(zip(present, vecs, strict=True))
    means, empty = speaker_means(spk2utt, by_utt, spk_mean)
    # all files appear together (xvector.scp last) or none does, a full disk included
    with StagedOutputs(out_dir, MERGED_FILES) as staged:
        _stage_vectors(staged, "spk_xvector", means)
        for name, table in (
            ("bad_utts", {u: bad[u] for u in utts if u in bad} if skip_bad else {}),
            ("bad_spks", {s: "all its utterances failed" for s in empty}),
        ):
            if table:
                staged.write_text(name, "".join(f"{k} {v}\n" for k, v in table.items()))
        _stage_vectors(staged, "xvector", [(u, by_utt[u]) for u in present])
    if empty:
        log.warning(
            "%d speaker(s) have no embedded utterance and get no mean (listed in %s/bad_spks): %s",
            len(empty),
            out_dir,
            show_keys(empty),
        )
    xv_scp, sp_scp = staged.path("xvector.scp"), staged.path("spk_xvector.scp")
    return MergeReport(
        len(present), len(means), dims.pop() if dims else 0, bad if skip_bad else {}, empty, xv_scp, sp_scp
    )


# =============================================================================== alignment


def align_scp(data_dir: str | os.PathLike[str], scp: str | os.PathLike[str], *, write: bool = True) -> str:
    """Filter ``scp`` to the data dir's keys, sort it in the data dir's order and verify it.

    The keys are the data dir's utterances (``utt2spk``) or, when the scp holds more speaker
    ids than utterance ids, its speakers (``spk2utt``, for ``spk_xvector.scp``).  Lines whose
    key the data dir lacks are dropped (counted in the returned summary).  Then the scp must
    list exactly the data dir's keys: otherwise :class:`InputError` names the first line where
    they differ and how many keys are missing, and the file is left as it was.  With ``write``
    the filtered, sorted scp replaces the original atomically.
    """

    scp = os.fspath(scp)
    utts, spk2utt = data_dir_keys(data_dir)
    entries = read_kv_lines(scp)
    seen: dict[str, int] = {}
    for n, (k, _) in enumerate(entries, 1):
        if k in seen:
            raise InputError(scp, n, f"duplicate key {k!r} (first on line {seen[k]})")
        seen[k] = n
    keys_u, keys_s = set(utts), set(spk2utt)
    n_u, n_s = sum(k in keys_u for k in seen), sum(k in keys_s for k in seen)
    ref, what = (list(spk2utt), "spk2utt") if n_s > n_u else (utts, "utt2spk")
    refset = set(ref)
    table = dict(entries)
    kept = [k for k in ref if k in table]
    dropped = len(entries) - len(kept)
    for i, k in enumerate(ref):
        got = kept[i] if i < len(kept) else None
        if got != k:
            nmiss = len(ref) - len(kept)
            found = f"'{got}'" if got is not None else "end of file"
            raise InputError(
                scp,
                None,
                f"after filtering and sorting, line {i + 1} should be '{k}' "
                f"(line {i + 1} of {os.fspath(data_dir)}/{what}) but is {found}; "
                f"{nmiss} key(s) of the data dir have no entry",
            )
    assert len(kept) == len(ref) and refset == set(kept)
    if write:
        with atomic_write(scp, "wb", encoding=None) as f:
            f.write("".join(f"{k} {table[k]}\n" for k in kept).encode("utf-8", "surrogateescape"))
    return f"{scp}: {len(kept)} keys aligned with {what}" + (f", {dropped} dropped" if dropped else "")
