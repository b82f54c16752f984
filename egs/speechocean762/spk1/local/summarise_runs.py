#!/usr/bin/env python3
"""Tables and a plot over evaluated runs, from stage 6's ``exp/<run>/eval/<set>/metrics.json``.

    python local/summarise_runs.py --sets "test dsp20 dsp20_8k libri fsdd" --dev_sets "test dsp20 dsp20_8k" \\
        exp/spk_xsnbwd25_e84_seed0 exp/spk_xsnbwd25_e84_seed1 ...
    python local/summarise_runs.py --sets "test dsp20 dsp20_8k libri fsdd" --dev_sets "test dsp20 dsp20_8k" \\
        --heldout "libri fsdd" --peer exp/peer_resemblyzer --plot exp/dev_vs_heldout.png exp/spk_*_seed*

Prints the markdown table of ``local/compare_losses.sh`` (one row per run, EER and minDCF per
set, the development mean over ``--dev_sets``, the wall time of stages 3-6 where the run recorded
it, and a mean row per config: runs named ``<config>_seed<N>`` share a config).  With
``--heldout`` it also says how well the development mean predicts each held-out set over the
runs (Pearson's r, one point per run), and with ``--plot`` draws that: EER on each held-out set
against the development mean, one point per run, one colour per config, its runs joined to
their mean (x), the ``--peer`` system's figures as reference lines.  Runs that lack a set are left out, named.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import numpy as np
import yaml


def read_run(run: Path, sets: list[str]) -> dict[str, dict] | None:
    """metrics.json of each set, or None when one is missing."""
    out = {}
    for s in sets:
        path = run / "eval" / s / "metrics.json"
        if not path.is_file():
            return None
        try:
            out[s] = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            sys.exit(f"summarise_runs.py: {path}: not JSON ({err})")
    return out


def config_of(run: Path) -> str:
    """``spk_<config>_seed<N>`` -> ``<config>``; a run without a seed suffix is its own config."""
    name = run.name.removeprefix("spk_")
    return name.rsplit("_seed", 1)[0] if "_seed" in name else name


def seed_of(run: Path) -> str:
    name = run.name.removeprefix("spk_")
    return name.rsplit("_seed", 1)[1] if "_seed" in name else "-"


def by_config(runs: dict[Path, dict[str, dict]]) -> dict[str, list[Path]]:
    groups: dict[str, list[Path]] = {}
    for run in runs:
        groups.setdefault(config_of(run), []).append(run)
    return groups


def table(runs: dict[Path, dict[str, dict]], sets: list[str], dev: list[str]) -> list[str]:
    dev_head = f" development mean EER % ({', '.join(dev)}) |" if dev else ""
    head = "| config | loss | seed | " + " | ".join(f"{s} EER % | {s} minDCF0.01" for s in sets) + " |"
    head += dev_head + " wall (stages 3-6) |"
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name, members in by_config(runs).items():
        eers: dict[str, list[float]] = {s: [] for s in sets}
        for run in members:
            m = runs[run]
            cfg = run / "config.yaml"
            loss = yaml.safe_load(cfg.read_text())["loss"]["name"] if cfg.is_file() else "-"
            for s in sets:
                eers[s].append(m[s]["eer"])
            cells = " | ".join(f"{m[s]['eer']:.2f} | {m[s]['min_dcf_p0.01']:.3f}" for s in sets)
            wall = run / "wall_seconds"
            wall_cell = f"{int(wall.read_text()) / 60:.1f} min" if wall.is_file() else "-"
            dev_cell = f" {statistics.mean(m[s]['eer'] for s in dev):.2f} |" if dev else ""
            lines.append(f"| {name} | {loss} | {seed_of(run)} | {cells} |{dev_cell} {wall_cell} |")
        if len(members) > 1:
            means = " | ".join(c for s in sets for c in (f"{statistics.mean(eers[s]):.2f}", ""))
            dev_cell = f" **{statistics.mean(statistics.mean(eers[s]) for s in dev):.2f}** |" if dev else ""
            lines.append(f"| {name} | | mean | {means} |{dev_cell} |")
    return lines


def dev_mean(m: dict[str, dict], dev: list[str]) -> float:
    return statistics.mean(m[s]["eer"] for s in dev)


def correlations(runs: dict[Path, dict[str, dict]], dev: list[str], heldout: list[str]) -> dict[str, float]:
    x = np.array([dev_mean(m, dev) for m in runs.values()])
    return {h: float(np.corrcoef(x, [m[h]["eer"] for m in runs.values()])[0, 1]) for h in heldout}


def plot(path: Path, runs: dict[Path, dict[str, dict]], dev: list[str], r: dict[str, float], peer: dict | None) -> None:
    """One panel per held-out set of ``r`` (its correlation with the development mean)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from spkflow.core.atomic import atomic_write

    heldout = list(r)
    fig = Figure(figsize=(4.2 * len(heldout), 4.0), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(heldout), squeeze=False)[0]
    for ax, h in zip(axes, heldout, strict=True):
        for members in by_config(runs).values():
            xs = [dev_mean(runs[m], dev) for m in members]
            ys = [runs[m][h]["eer"] for m in members]
            pts = ax.plot(xs, ys, "o", ms=4, alpha=0.7)
            if len(members) > 1:
                mx, my = statistics.mean(xs), statistics.mean(ys)
                for x, y in zip(xs, ys, strict=True):
                    ax.plot([x, mx], [y, my], "-", lw=0.6, color=pts[0].get_color(), alpha=0.5)
                ax.plot([mx], [my], "x", ms=6, color=pts[0].get_color())
        if peer is not None:
            ax.axhline(peer[h]["eer"], color="k", ls="--", lw=1, label=f"{peer[h]['model_tag']} {peer[h]['eer']:.2f}")
            ax.axvline(dev_mean(peer, dev), color="k", ls=":", lw=1)
            ax.legend(loc="upper left", fontsize=8)
        ax.set_xlabel(f"development mean EER % ({', '.join(dev)})")
        ax.set_ylabel(f"{h} EER % (held out)")
        ax.set_title(f"{h}: r = {r[h]:+.2f} over {len(runs)} runs", fontsize=10)
        ax.grid(alpha=0.3)
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sets", required=True, help="test sets, e.g. 'test dsp20 libri'")
    p.add_argument("--dev_sets", default="", help="the development mean is over these (each among --sets)")
    p.add_argument("--heldout", default="", help="sets to correlate with the development mean (each among --sets)")
    p.add_argument("--peer", default=None, help="a peer's experiment dir (eval/<set>/metrics.json): reference lines")
    p.add_argument("--plot", default=None, help="PNG: held-out EER against the development mean, one point per run")
    p.add_argument("runs", nargs="+", help="experiment dirs (exp/spk_<config>_seed<N>)")
    a = p.parse_args(argv)
    sets, dev, heldout = a.sets.split(), a.dev_sets.split(), a.heldout.split()
    for name, chosen in (("--dev_sets", dev), ("--heldout", heldout)):
        extra = [s for s in chosen if s not in sets]
        if extra:
            sys.exit(f"summarise_runs.py: {name} holds {' '.join(extra)}, which is not among --sets ({a.sets})")
    if (heldout or a.plot) and not (dev and heldout):
        sys.exit("summarise_runs.py: --heldout and --plot need --dev_sets and --heldout")
    runs: dict[Path, dict[str, dict]] = {}
    for run in map(Path, a.runs):
        m = read_run(run, sets)
        if m is None:
            print(f"summarise_runs.py: {run} lacks a set of '{a.sets}': left out", file=sys.stderr)
        else:
            runs[run] = m
    if not runs:
        sys.exit("summarise_runs.py: no run has every set")
    print("\n".join(table(runs, sets, dev)))
    r: dict[str, float] = {}
    if heldout:
        if len(runs) < 3:
            sys.exit(f"summarise_runs.py: a correlation needs 3 runs or more, got {len(runs)}")
        r = correlations(runs, dev, heldout)
        for h, rh in r.items():
            print(f"development mean vs {h}: r = {rh:+.2f} over {len(runs)} runs")
    if a.plot:
        peer = read_run(Path(a.peer), sets) if a.peer else None
        if a.peer and peer is None:
            sys.exit(f"summarise_runs.py: --peer {a.peer} lacks a set of '{a.sets}'")
        plot(Path(a.plot), runs, dev, r, peer)
        print(f"wrote {a.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
