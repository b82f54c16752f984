"""The scoring plan of a recipe: which sets stage 5 embeds and what stage 6 fits and scores.

``spk.sh`` passes its options (test sets, calibration set, backend, cohort, QMF, a pretrained
model) to ``python -m spkflow.bin.scoring_plan``; :class:`ScoringOptions` holds them and
answers:

* :meth:`ScoringOptions.check`: the options that cannot go together, refused before stage 1;
* :meth:`ScoringOptions.data_sets`: the data dirs stage 1 checks (a pretrained model needs no
  training set unless stage 6 fits its scoring there);
* :meth:`ScoringOptions.embed_sets`: the sets stage 5 embeds, each once, the training set first
  when stage 6 needs its embeddings (cohort, centring, backend, QMF, default calibration);
* :func:`stage6`: stage 6 as a :class:`ScoringPlan`, a list of :class:`Step` (say a line, or run
  one command with its log), which :func:`run_plan` carries out.

What it guarantees that ESPnet's ``spk.sh`` and WeSpeaker's ``run.sh`` (the same decisions made
in bash from flags) do not: the decisions are one function of the options and the files on
disk, tested without running anything (``show`` prints the steps); each set is embedded once
however it is named (a calibration set that is also a test set, ``--embed_sets`` naming the
training set); every fitting step runs the same way (its output in its own log; on failure the
log's last lines and one error line naming it); a file a step needs is checked right before it
runs, naming the stage that writes it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

__all__ = ["PlanError", "ScoringOptions", "ScoringPlan", "Step", "run_plan", "stage6"]


class PlanError(ValueError):
    """Options that cannot go together, or a file a step needs is missing (one line)."""


def _unique(sets: Iterable[str]) -> list[str]:
    """Each name once, in first-seen order, empty names dropped."""
    return list(dict.fromkeys(s for s in sets if s))


@dataclass(frozen=True)
class ScoringOptions:
    """``spk.sh``'s options for stages 5-6 (the names are its own), and the model it scores with.

    ``packed``: the model brings its own scoring (a pretrained model of ours, or an experiment
    dir unpacked from a pack); nothing is fitted then.
    """

    exp: str
    model_dir: str = ""
    pretrained: str = ""
    packed: bool = False
    train_set: str = "train"
    test_sets: tuple[str, ...] = ("test",)
    valid_set: str = ""
    embed_sets: tuple[str, ...] = ()
    extract_train: bool = False
    calibrate: bool = True
    calib_set: str = ""
    calib_prior: float = 0.5
    score_norm: bool = False
    cohort_size: int = 200
    score_center: bool = False
    score_eval_mean: bool = False
    score_backend: str = "cosine"
    backend_reg: float = 0.1
    score_skip_missing: bool = False
    score_qmf: bool = False
    qmf_trials: int = 20000

    def check(self) -> None:
        """Raise :class:`PlanError` for options that cannot go together."""
        if self.score_backend != "cosine":  # a fitted backend: its names (numpy is imported only then)
            from spkflow.score.backend import BACKENDS

            if self.score_backend not in BACKENDS:
                raise PlanError(
                    f"--score_backend must be {', '.join(BACKENDS[:-1])} or {BACKENDS[-1]}, got '{self.score_backend}'"
                )
        if self.score_backend != "cosine" and self.score_center:
            raise PlanError(
                f"--score_backend {self.score_backend} centres on the training mean itself: set --score_center false"
            )
        if self.score_center and self.score_eval_mean:
            raise PlanError(
                "--score_center true and --score_eval_mean true: "
                "centre on the training mean or on each set's own, not both"
            )
        if self.packed and self.score_qmf:
            raise PlanError(
                "--score_qmf true draws its trials from the training set: a pretrained model "
                f"({self.model_dir}) scores with its own packed scoring"
            )

    @property
    def train_scoring(self) -> bool:
        """Stage 6 cannot go without the training set's embeddings (cohort, centring, backend, QMF)."""
        uses = self.score_norm or self.score_center or self.score_backend != "cosine" or self.score_qmf
        return not self.packed and uses

    @property
    def train_cohort(self) -> bool:
        """Stage 6 uses the training set's embeddings: for its scoring, or the default calibration
        (which goes without, saying so, when a pretrained model's recipe has no training set)."""
        return self.train_scoring or (not self.packed and self.calibrate and not self.calib_set)

    def data_sets(self) -> list[str]:
        """The data dirs stage 1 checks: a pretrained model's recipe needs no training set or
        validation set unless stage 6 uses the training set."""
        if self.pretrained and not self.train_cohort:
            return _unique([self.calib_set, *self.test_sets])
        return _unique([self.train_set, self.calib_set, *self.test_sets, self.valid_set])

    def embed_sets_and_note(self) -> tuple[list[str], str]:
        """The sets stage 5 embeds, each once, and a note when stage 6 will miss the training set."""
        sets = list(self.embed_sets) or [*self.test_sets, self.valid_set]
        if self.extract_train:
            sets.insert(0, self.train_set)
        if not self.packed and self.calibrate and self.calib_set:
            sets.append(self.calib_set)
        note = ""
        if self.train_cohort and self.train_set not in sets:
            if self.train_scoring or _nonempty(f"data/{self.train_set}/utt2spk"):
                sets.insert(0, self.train_set)  # stage 6 needs the training speakers' embeddings
            else:  # only the default calibration wanted it: stage 6 says what that means
                note = (
                    f"No data/{self.train_set} to embed for stage 6's default calibration "
                    "(--calib_set SET calibrates on SET)"
                )
        return _unique(sets), note


def _nonempty(path: str) -> bool:
    return os.path.isfile(path) and os.path.getsize(path) > 0


@dataclass(frozen=True)
class Step:
    """One thing stage 6 does: say ``say``; then, with ``args``, run a command (``module``: a
    ``python -m`` module; else ``args`` is the command line) after checking that ``needs`` exist.

    ``log``: the command's output goes there (on failure its last lines are shown and ``error``
    is said); without one the command writes to the console and says itself why it failed.
    ``echo``: a regular expression; the log's matches are said after it succeeded.
    """

    say: str = ""
    module: str = ""
    args: tuple[str, ...] = ()
    log: str = ""
    error: str = ""
    needs: tuple[str, ...] = ()
    needs_why: str = ""
    echo: str = ""

    def command(self) -> list[str]:
        return [sys.executable, "-m", self.module, *self.args] if self.module else list(self.args)


@dataclass(frozen=True)
class ScoringPlan:
    """Stage 6: earlier outputs to remove first, then the steps in order; ``results`` is the summary."""

    steps: tuple[Step, ...]
    remove: tuple[str, ...] = ()
    results: str = ""

    def script(self) -> str:
        """The plan as a shell script (what ``show`` prints): each step's line as a comment, its command."""
        lines = [f"rm -f {shlex.quote(path)}" for path in self.remove]
        for step in self.steps:
            lines += [f"# {step.say}"] if step.say else []
            if step.args:
                lines.append(shlex.join(step.command()) + (f" > {shlex.quote(step.log)} 2>&1" if step.log else ""))
        return "".join(f"{line}\n" for line in lines)


def stage6(o: ScoringOptions) -> ScoringPlan:
    """Stage 6 for options ``o``, given the files stages 1-5 left (paths relative to the recipe dir)."""
    o.check()
    exp = o.exp
    steps: list[Step] = []
    remove: list[str] = []
    score = [
        *("--model-tag", os.path.basename(os.path.normpath(exp)), "--skip-missing", _b(o.score_skip_missing)),
        *("--eval-mean", _b(o.score_eval_mean), "--results-md", exp),
    ]
    qmf: list[str] = []
    if o.packed:  # the model's own scoring (backend, cohort, calibration), as packed; nothing is fitted here
        if os.path.exists(os.path.join(o.model_dir, "scoring.yaml")):
            say = (
                f"Scoring with the model's packed scoring ({o.model_dir}/scoring.yaml); --score_* options are not used"
            )
            steps.append(Step(say=say))
            score += ["--scoring-dir", o.model_dir]
        else:
            steps.append(
                Step(say=f"{o.model_dir} holds no scoring (scoring.yaml): plain cosine scores, no calibration")
            )
        if os.path.normpath(o.model_dir) == os.path.normpath(exp):  # unpacked in place: the pack's RESULTS.md stays
            score += ["--results-file", os.path.join(exp, "eval", "RESULTS.md")]
    else:
        fit, qmf, calib = _fitting(o, steps, remove)
        score += calib or fit
    for dset in o.test_sets:
        trials, scp = f"data/{dset}/trials", f"{exp}/embed/{dset}/xvector.scp"
        extra = ["--utt2dur", f"data/{dset}/utt2dur"] if o.score_qmf and os.path.exists(f"data/{dset}/utt2dur") else []
        steps.append(
            Step(
                args=("scripts/spk/score.sh", *score, *qmf, *extra, trials, scp, f"{exp}/eval/{dset}"),
                needs=(trials, scp),
                needs_why="stage 1 writes trials, stage 5 embeddings",
            )
        )
    packed_in_place = o.packed and os.path.normpath(o.model_dir) == os.path.normpath(exp)
    results = os.path.join(exp, "eval", "RESULTS.md") if packed_in_place else os.path.join(exp, "RESULTS.md")
    steps.append(Step(say=f"Results: {results}, plots in {exp}/eval/<set>/{{det,score_hist}}.png"))
    return ScoringPlan(tuple(steps), tuple(remove), results)


def _b(flag: bool) -> str:
    return "true" if flag else "false"


def _fitting(o: ScoringOptions, steps: list[Step], remove: list[str]) -> tuple[list[str], list[str], list[str]]:
    """The steps that fit a scoring on the training set (backend, calibration, QMF); returns
    score.sh's options for the uncalibrated scoring, for the QMF and for the calibrated scoring
    (empty: not calibrated)."""
    exp, train = o.exp, o.train_set
    cohort = f"{exp}/embed/{train}/spk_xvector.scp"
    if o.train_scoring and not os.path.exists(cohort):
        raise PlanError(
            f"score_norm/score_center/score_backend and the default calibration need the training set's embeddings "
            f"{cohort}: run stage 5 with the same options (it then embeds {train})"
        )
    fit: list[str] = []
    if o.score_norm:
        fit += ["--cohort-scp", cohort, "--cohort-size", str(o.cohort_size)]
    if o.score_center:
        fit += ["--mean-scp", cohort]
    train_scp, utt2spk = f"{exp}/embed/{train}/xvector.scp", f"data/{train}/utt2spk"
    if o.score_backend != "cosine":
        backend = f"{exp}/backend/{o.score_backend}.npz"
        steps.append(
            Step(
                say=f"Fitting the {o.score_backend} backend on {train_scp} -> {backend}",
                module="spkflow.bin.fit_backend",
                args=("--backend", o.score_backend, "--reg", str(o.backend_reg), "--xvector-scp", train_scp)
                + ("--utt2spk", utt2spk, "--out", backend),
                log=f"{exp}/backend/log/fit_{o.score_backend}.log",
                error="fitting the backend failed",
            )
        )
        fit += ["--backend", backend]
    calib: list[str] = []
    why = "--calibrate false"
    # another toolkit's model in a recipe without a training set: scored, not calibrated
    if o.calibrate and o.pretrained and not o.calib_set and not (_nonempty(utt2spk) and os.path.exists(train_scp)):
        why = f"no --calib_set and no utterance embeddings of {train} ({utt2spk}, {train_scp})"
    elif o.calibrate:
        calib = ["--scoring-dir", exp]
        steps += _calibration(o, fit)
    if not calib:
        steps.append(Step(say=f"No calibration ({why}): the scores are not log-likelihood ratios"))
        remove += [f"{exp}/scoring.yaml", f"{exp}/scoring.npz"]  # an earlier run's: stage 7 must not pack it
    qmf: list[str] = []
    if o.score_qmf:
        out = f"{exp}/qmf/qmf.json"
        args = ["--xvector-scp", train_scp, "--utt2spk", utt2spk, "--num-trials", str(o.qmf_trials), "--out", out]
        args += ["--eval-mean", _b(o.score_eval_mean)]
        if os.path.exists(f"data/{train}/utt2dur"):
            args += ["--utt2dur", f"data/{train}/utt2dur"]
        steps.append(
            Step(
                say=f"Fitting the QMF on {o.qmf_trials} + {o.qmf_trials} trials of {train} -> {out}",
                module="spkflow.bin.fit_qmf",
                args=(*args, *fit),
                log=f"{exp}/qmf/log/fit_qmf.log",
                error="fitting the QMF failed",
                echo=r"QMF \(.*",
            )
        )
        qmf = ["--qmf", out]
    return fit, qmf, calib


def _calibration(o: ScoringOptions, fit: Sequence[str]) -> list[Step]:
    """Score -> LLR on trials the reported figures do not come from: those of the calibration
    set, or trials drawn from the training set, scored as the test sets are."""
    exp, train = o.exp, o.train_set
    steps: list[Step] = []
    if o.calib_set:
        trials, name = f"data/{o.calib_set}/trials", o.calib_set
    else:
        trials, name = f"{exp}/calib/trials", f"{train} (seen in training)"
        steps.append(
            Step(
                module="spkflow.bin.make_trials",
                args=("--max-per-spk", "8", "--nontarget-ratio", "10", "--seed", "0", f"data/{train}", trials),
                log=f"{exp}/calib/log/make_trials.log",
                error=f"the default calibration trials are drawn from data/{train} (or give --calib_set SET)",
            )
        )
    scp = f"{exp}/embed/{o.calib_set or train}/xvector.scp"
    log = f"{exp}/calib/log/calibrate.log"
    steps.append(
        Step(
            say=f"Calibration on {trials} ({name}) -> {exp}/scoring.yaml (log: {log})",
            module="spkflow.bin.calibrate",
            args=("--trials", trials, "--xvector-scp", scp, *fit, "--p-target", str(o.calib_prior))
            + ("--set-name", name, "--out-dir", exp),
            log=log,
            error="the calibration failed",
            needs=(trials, scp),
            needs_why="the calibration's trials and embeddings: stages 1 and 5",
            echo=r"LLR = .*",
        )
    )
    return steps


def run_plan(plan: ScoringPlan, say: Callable[[str], None], tail: int = 3) -> None:
    """Carry out ``plan``: remove its stale files, then each step in order.  A step that fails
    raises :class:`PlanError` after its log's last ``tail`` lines went to standard error."""
    for path in plan.remove:
        if os.path.exists(path):
            os.unlink(path)
    for step in plan.steps:
        for path in step.needs:
            if not os.path.exists(path):
                raise PlanError(f"{path} not found ({step.needs_why})")
        if step.say:
            say(step.say)
        if not step.args:
            continue
        if not step.log:
            if subprocess.run(step.command(), check=False).returncode != 0:
                raise PlanError(step.error or f"{step.args[0]} failed (it said why above)")
            continue
        os.makedirs(os.path.dirname(step.log) or ".", exist_ok=True)
        with open(step.log, "w", encoding="utf-8") as out:
            rc = subprocess.run(step.command(), stdout=out, stderr=subprocess.STDOUT, check=False).returncode
        with open(step.log, encoding="utf-8", errors="replace") as f:
            text = f.read()
        if rc != 0:
            sys.stderr.write("".join(text.splitlines(True)[-tail:]))
            sys.stderr.flush()
            raise PlanError(f"{step.error}, see {step.log}")
        for match in re.findall(step.echo, text) if step.echo else ():
            say(match)
