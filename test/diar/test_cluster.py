"""Clustering, windows and turns on vectors and times made here: the speaker count found, the
midpoint rule, stable labels."""

from __future__ import annotations

import numpy as np
import pytest

from spkflow.diar.cluster import ahc_labels, resegment, spectral_labels
from spkflow.diar.pipeline import RESEGMENT_FROM, DiarOptions, cluster_recording, diarize_recording
from spkflow.diar.rttm import Turn
from spkflow.diar.windows import Window, plan_windows, relabel, windows_to_turns
from spkflow.score.calibration import LogisticCalibration
from spkflow.score.model_scoring import Scoring


def _speaker_runs(k: int, per: int = 12, dim: int = 32, noise: float = 0.35, seed: int = 0):
    """Windows in time order: speaker turns of ``per`` windows each, k speakers taking turns twice."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((k, dim))
    order = [s for _ in range(2) for s in range(k)]
    truth = np.repeat(order, per)
    x = centres[truth] + noise * rng.standard_normal((len(truth), dim)) * np.linalg.norm(centres[0]) / np.sqrt(dim)
    return x, truth


def l2(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _agree(a, b) -> bool:
    """Same partition up to renaming."""
    return len(set(zip(a.tolist(), b.tolist(), strict=True))) == len(set(a.tolist())) == len(set(b.tolist()))


@pytest.mark.parametrize("k", [1, 2, 4])
def test_spectral_finds_the_speaker_count(k):
    x, truth = _speaker_runs(k)
    y = x / np.linalg.norm(x, axis=1, keepdims=True)
    assert _agree(spectral_labels(y, max_speakers=6), truth)


def test_spectral_with_the_count_given_and_bounded():
    x, truth = _speaker_runs(3)
    y = x / np.linalg.norm(x, axis=1, keepdims=True)
    assert len(set(spectral_labels(y, num_speakers=2).tolist())) == 2
    assert len(set(spectral_labels(y, max_speakers=2).tolist())) <= 2
    assert spectral_labels(y[:1]).tolist() == [0]


def test_ahc_stops_at_the_llr_threshold():
    """Cosine 0.5 -> LLR 0: within-speaker windows (cosine ~0.9) merge, others (~0) do not."""
    x, truth = _speaker_runs(3)
    cal = Scoring(calibration=LogisticCalibration((10.0,), -5.0))
    labels = cluster_recording(x, cal, DiarOptions(method="ahc", centre="none", resegment=False))
    assert _agree(labels, truth)
    # a threshold above every score: nothing merges; the count given: exactly that many
    llr = -3.0 - np.random.default_rng(0).random((4, 4))
    assert sorted(ahc_labels(llr, 0.0).tolist()) == [0, 1, 2, 3]
    assert len(set(ahc_labels(llr, 0.0, num_speakers=2).tolist())) == 2


def test_centring_on_the_set_carries_the_threshold_over_a_shifted_domain():
    """Recordings from a domain the calibration never saw: every window shares a large offset, so
    on the training mean (none) all windows look alike and AHC at LLR 0 merges the two speakers; on
    the windows of the set (other recordings of that domain, other speakers) the offset is gone and
    the two are found; on the recording's own windows too here (two speakers), and ``set`` with the
    recording as its set is exactly ``recording``."""
    rng = np.random.default_rng(3)
    x, truth = _speaker_runs(2, seed=1)
    offset = 4.0 * np.linalg.norm(x, axis=1).mean() * rng.standard_normal(x.shape[1]) / np.sqrt(x.shape[1])
    others, _ = _speaker_runs(4, seed=2)  # the set's other recordings: four other speakers
    shifted, domain = x + offset, np.vstack([x, others]) + offset
    cal = Scoring(calibration=LogisticCalibration((10.0,), -5.0))

    def labels(centre: str, dom=None):
        return cluster_recording(shifted, cal, DiarOptions(method="ahc", centre=centre, resegment=False), dom)

    assert len(set(labels("none").tolist())) == 1
    assert _agree(labels("set", domain), truth)
    assert labels("set", shifted).tolist() == labels("recording").tolist()
    with pytest.raises(ValueError, match="set's windows"):
        labels("set")
    with pytest.raises(ValueError, match="centre must be one of"):
        DiarOptions(centre="true")


def test_ahc_without_calibration_needs_the_count_or_a_threshold():
    x, truth = _speaker_runs(2)
    with pytest.raises(ValueError, match="no calibration"):
        cluster_recording(x, Scoring(), DiarOptions(method="ahc"))
    assert len(set(cluster_recording(x, Scoring(), DiarOptions(method="ahc", num_speakers=2)).tolist())) == 2
    # a threshold on the cosine (within a speaker ~0.9, across ~0): the two speakers, no calibration
    opts = DiarOptions(method="ahc", centre="none", resegment=False, threshold=0.5)
    assert _agree(cluster_recording(x, Scoring(), opts), truth)


def test_a_threshold_moves_where_ahc_stops():
    """Against the calibrated LLR (cosine 0.5 -> 0): a threshold above every within-speaker LLR
    splits every window, one below every across-speaker LLR merges all; the LLR merge after
    spectral clustering stops at it too."""
    x, truth = _speaker_runs(3)
    cal = Scoring(calibration=LogisticCalibration((10.0,), -5.0))

    def count(method: str, threshold: float | None) -> int:
        opts = DiarOptions(method=method, centre="none", resegment=False, threshold=threshold)
        return len(set(cluster_recording(x, cal, opts).tolist()))

    assert count("ahc", None) == count("ahc", 0.0) == 3
    assert count("ahc", 6.0) == 8  # every window apart, up to max_speakers
    assert count("ahc", -16.0) == 1  # LLRs lie in [-15, 5]
    assert count("spectral", None) == 3 and count("spectral", -16.0) == 1
    assert "stopped at -16" in DiarOptions(method="ahc", threshold=-16.0).describe()


def test_resegment_fixes_isolated_errors():
    x, truth = _speaker_runs(2, noise=0.2)
    y = x / np.linalg.norm(x, axis=1, keepdims=True)
    bad = truth.copy()
    bad[[3, 17, 30]] = 1 - bad[[3, 17, 30]]
    assert _agree(resegment(y, bad), truth)


def test_plan_windows():
    ws = plan_windows("r", [(0.0, 3.0), (4.0, 4.3), (5.0, 6.0)], 1.5, 0.75, 0.5)
    assert [(w.start, w.end) for w in ws] == [(0.0, 1.5), (0.75, 2.25), (1.5, 3.0), (5.0, 6.0)]
    assert ws[0].id == "r-00000000-00001500"
    with pytest.raises(ValueError):
        plan_windows("r", [(0, 1)], 1.5, 2.0)


def test_windows_to_turns_midpoints_and_stable_labels():
    ws = [Window("r", 0.0, 1.5), Window("r", 0.75, 2.25), Window("r", 1.5, 3.0), Window("r", 5.0, 6.0)]
    turns = windows_to_turns(ws, [7, 7, 3, 7], [(0.0, 3.0), (4.0, 4.3), (5.0, 6.0)])
    # window 2 (label 3) owns from the midpoint of its overlap with window 1: (1.5 + 2.25) / 2
    assert turns == [
        Turn("r", 0.0, 1.875, "spk1"),
        Turn("r", 1.875, 3.0, "spk2"),
        Turn("r", 4.0, 4.3, "spk1"),  # no window: the label of the nearest (centre 5.5, not 2.25)
        Turn("r", 5.0, 6.0, "spk1"),
    ]
    assert relabel([5, 5, 2, 9, 2]) == [0, 0, 1, 2, 1]


def test_one_window_and_no_window():
    ws = [Window("r", 0.0, 0.8)]
    assert diarize_recording(ws, np.ones((1, 4)), [(0.0, 0.8)], Scoring(), DiarOptions()) == [
        Turn("r", 0.0, 0.8, "spk1")
    ]
    assert diarize_recording([], np.zeros((0, 4)), [], Scoring(), DiarOptions()) == []


def test_spectral_then_calibrated_merge_finds_one_speaker():
    """Spectral clustering gives at least two clusters; the calibrated LLR between their speaker
    models (cosine ~1 -> LLR 5 > 0) merges them back into the one speaker there is."""
    x, _ = _speaker_runs(1)
    cal = Scoring(calibration=LogisticCalibration((10.0,), -5.0))
    assert set(cluster_recording(x, cal, DiarOptions()).tolist()) == {0}
    x3, truth = _speaker_runs(3)
    assert _agree(cluster_recording(x3, cal, DiarOptions()), truth)


def test_spectral_on_more_windows_than_it_decomposes():
    """Over MAX_SPECTRAL windows (a long meeting), groups of consecutive windows are clustered and
    every window gets its group's label (the count given: with 600 points the eigengap over-splits
    these vectors, as RESULTS.md's spectral rows over-count; the recipe clusters by AHC)."""
    from spkflow.diar.cluster import MAX_SPECTRAL

    x, truth = _speaker_runs(3, per=40)
    x = np.tile(x, (-(-2 * MAX_SPECTRAL // len(x)), 1))
    truth = np.tile(truth, -(-2 * MAX_SPECTRAL // len(truth)))
    y = x / np.linalg.norm(x, axis=1, keepdims=True)
    labels = resegment(y, spectral_labels(y, num_speakers=3))
    assert len(labels) == len(truth) > MAX_SPECTRAL and _agree(labels, truth)


@pytest.mark.parametrize("bad", ["nan", "inf", "x"])
def test_a_threshold_is_a_finite_number(bad, capsys):
    from spkflow.bin.diar_cluster import main

    with pytest.raises(SystemExit) as e:
        main(["--work-dir", "w", "--out", "o.rttm", "--threshold", bad])
    assert e.value.code == 2 and "--threshold" in capsys.readouterr().err


def test_resegment_smooths_over_neighbouring_windows():
    """A window nearer the other speaker inside one speaker's run stays with its neighbours: its
    similarities are averaged with one window on each side (unsmoothed, it would move)."""
    e1, e2 = np.eye(2)
    x = np.array([e1] * 6 + [e2] * 6)
    x[2] = (0.4 * e1 + 0.6 * e2) / np.linalg.norm(0.4 * e1 + 0.6 * e2)
    labels = np.array([0] * 6 + [1] * 6)
    assert resegment(x, labels).tolist() == labels.tolist()
    assert resegment(x, labels, smooth=0)[2] == 1  # what the smoothing prevents


def test_a_forced_count_is_not_spent_on_outlying_windows():
    """8 speakers of 60 windows each and 3 outlying windows (each like no speaker): the tree cut at
    8 clusters would spend 3 of them on the outliers and put 3 speakers in the others; the forced
    count counts only clusters of >= MIN_SHARE of the windows, so each speaker gets its own."""
    x, truth = _speaker_runs(8, per=30, dim=64, noise=0.2, seed=3)
    rng = np.random.default_rng(9)
    out = 3.0 * np.linalg.norm(x[0]) * l2(rng.standard_normal((3, x.shape[1])))
    at = [100, 250, 400]
    x = np.insert(x, at, out, axis=0)
    y = l2(x)
    labels = ahc_labels(y @ y.T, 0.0, num_speakers=8)
    assert len(set(labels.tolist())) == 8
    speakers = np.delete(labels, [a + i for i, a in enumerate(at)])
    assert _agree(speakers, truth)


def test_resegment_keeps_a_forced_count():
    """A cluster whose every window is nearer another speaker's centroid is emptied by plain
    resegmentation, and kept (with its window) when the count is forced (``keep``)."""
    x, truth = _speaker_runs(2, noise=0.2)
    y = l2(x)
    labels = truth.copy()
    labels[5] = 2  # a third cluster of one window inside speaker 0's run
    assert len(set(resegment(y, labels, min_windows=0).tolist())) == 2
    kept = resegment(y, labels, keep=True)
    assert sorted(set(kept.tolist())) == [0, 1, 2] and kept[5] == 2


def test_resegmentation_by_default_only_with_a_forced_count():
    """The default (``resegment=None``): an estimated count is AHC's own (leave-one-corpus-out,
    RESULTS.md), a forced one is resegmented (its windows reassigned, no cluster emptied), and so
    is a long recording's."""
    x, truth = _speaker_runs(2, noise=0.2)
    x[10] = -x[10]  # a window like no one: a cluster of its own, which resegmentation dissolves
    y = l2(x)
    cal = Scoring()
    est = cluster_recording(x, cal, DiarOptions(method="ahc", centre="none", threshold=0.5))
    assert est.tolist() == ahc_labels(y @ y.T, 0.5).tolist()
    assert len(set(est.tolist())) == 3 and len(set(resegment(y, est).tolist())) == 2
    forced = cluster_recording(x, cal, DiarOptions(method="ahc", centre="none", num_speakers=2))
    assert forced.tolist() == resegment(y, ahc_labels(y @ y.T, 0.0, num_speakers=2), keep=True).tolist()
    assert "resegmented from 600 windows" in DiarOptions().describe()
    assert "resegmented from" not in DiarOptions(num_speakers=2).describe()
    long, _ = _speaker_runs(2, per=RESEGMENT_FROM // 4, noise=0.2)  # as many windows as 7.5 minutes
    long[10] = -long[10]
    opts = DiarOptions(method="ahc", centre="none", threshold=0.5)
    assert len(set(ahc_labels(l2(long) @ l2(long).T, 0.5).tolist())) == 3
    assert len(set(cluster_recording(long, cal, opts).tolist())) == 2  # resegmented


def test_a_forced_count_the_windows_cannot_give_is_said(caplog):
    """1000 speakers asked of one speaker's 11 windows: at most one speaker per window (fewer where
    the windows give), and a warning naming the recording says so (not silently)."""
    x, _ = _speaker_runs(1, per=6)
    ws = [Window("r", 0.75 * i, 0.75 * i + 1.5) for i in range(11)]
    opts = DiarOptions(method="ahc", num_speakers=1000)
    turns = diarize_recording(ws, x[:11], [(0.0, ws[-1].end)], Scoring(), opts)
    found = len({t.speaker for t in turns})
    assert found == 11  # a forced count is kept through resegmentation
    assert f"r: 1000 speakers asked, {found} found: it has 11 windows of at most 1.50 s" in caplog.text


def test_diar_cluster_honours_num_speakers(tmp_path):
    """The recipe's clustering command on two recordings of two well-apart speakers each: two
    speakers estimated, three when ``--num-speakers 3`` asks for them."""
    import kaldiio

    from spkflow.bin.diar_cluster import main
    from spkflow.data.tables import write_kv
    from spkflow.diar.rttm import read_rttm
    from spkflow.diar.windows import write_window_dir

    work, wav, seg, windows = tmp_path / "work", {}, {}, []
    scp = tmp_path / "xvector.scp"
    with kaldiio.WriteHelper(f"ark,scp:{tmp_path / 'x.ark'},{scp}") as w:
        for r, seed in (("r1", 0), ("r2", 1)):
            x, _ = _speaker_runs(2, seed=seed)
            ws = [Window(r, 0.75 * i, 0.75 * i + 1.5) for i in range(len(x))]
            for win, v in zip(ws, x, strict=True):
                w(win.id, v.astype(np.float32))
            wav[r], seg[f"{r}-seg"] = f"{r}.wav", f"{r} 0.000 {ws[-1].end:.3f}"
            windows += ws
    (work / "speech").mkdir(parents=True)
    write_kv(work / "speech" / "wav.scp", wav)
    write_kv(work / "speech" / "segments", seg)
    write_window_dir(work / "windows", wav, windows)

    def speakers(*args: str) -> list[int]:
        out = tmp_path / "hyp.rttm"
        assert main(["--work-dir", str(work), "--xvector-scp", str(scp), *args, "--out", str(out)]) == 0
        turns = read_rttm(out).turns
        return [len({t.speaker for t in turns if t.recording == r}) for r in ("r1", "r2")]

    assert speakers() == [2, 2]
    assert speakers("--num-speakers", "3") == [3, 3]
