#!/usr/bin/env python3
"""How well ``diarize --gallery`` names the speakers of a meeting: simulated meetings of enrolled
speakers and strangers, the enrolled ones enrolled from utterances the meetings do not use.  Run
from the recipe's folder after stage 1 (`. ./path.sh`; it uses stage 1's speaker pools):

    python local/name_speakers.py --model ../spk1/exp/spk_train/packed/spk_train.zip \\
        [--pools "libri_pool so762_pool"] [--speech oracle|silero|energy] [--meetings 10] [--work exp/naming]

Per pool (``data/libri_pool``: the 8 LibriSpeech mini speakers; ``data/so762_pool``:
speechocean762's 125 test speakers; none of them seen in training): half the speakers (at most
20) enrolled from their first two utterances (``identify``'s enrolment, saved as a gallery), the
others strangers; ``--meetings`` conversations of at least 60 s (spkflow.sim, AMI's turn-taking)
of 2-4 speakers each, one or two of them strangers, from the enrolled speakers' *other* utterances
and the strangers' utterances; each diarized by ``python -m spkflow.bin.diarize``'s code
(``spkflow.diar.file_list.diarize_files``) with the gallery (``--clusters``: ``default``, the
command's defaults; ``domain``, ``--domain-mean data/<pool>``, the pool's recordings as the
recordings like these to centre on; ``reference``, the windows clustered perfectly, by their
reference speaker, and then named: what the naming alone gets right).
Figures, over the reference speech of each kind (overlap counted for every speaker in it):

* **named right**: the share of the enrolled speakers' speech whose hypothesis speaker carries
  their name;
* **named wrong**: the share of it carrying another enrolled speaker's name;
* **strangers unknown**: the share of the strangers' speech labelled ``unknown_<k>`` (the rest:
  an enrolled name given to a stranger);
* per speaker: enrolled speakers whose name went to the cluster holding most of their speech, and
  strangers who were given a name;
* **of its cluster**: the naming alone, apart from the clustering: of the speech each speaker's
  own cluster (the hypothesis speaker holding most of it) holds, the share named right (enrolled)
  or unknown (strangers).  Speech in another speaker's turns (overlap, window edges, clustering
  errors) is counted in the first figures, not here.

``--rescore`` prints the figures of the RTTMs an earlier run left under ``--work`` (its meetings,
gallery and hypotheses), remaking and rerunning nothing (``default`` and ``domain`` only).

Prints a markdown table; writes the meetings, the gallery and the RTTMs under ``--work``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import soundfile as sf

from spkflow import Embedder
from spkflow.data.audio import load_audio
from spkflow.data.tables import read_kv
from spkflow.deploy.decisions import Recordings
from spkflow.deploy.gallery import Gallery, embedder_stamp
from spkflow.diar.file_list import diarize_files
from spkflow.diar.naming import name_clusters, window_speakers
from spkflow.diar.pipeline import embed_windows
from spkflow.diar.regions import union
from spkflow.diar.result import Diarization
from spkflow.diar.rttm import Turn, read_rttm, write_rttm
from spkflow.diar.windows import windows_to_turns
from spkflow.sim.conversations import load_statistics, simulate_conversation


def overlap(a: list[Turn], b: list[Turn]) -> float:
    return sum(max(0.0, min(s.end, t.end) - max(s.start, t.start)) for s in a for t in b)


def make_meetings(emb: Embedder, pool: Path, work: Path, meetings: int, seed: int) -> dict:
    """The gallery and the meetings of one pool (see the module doc)."""
    wav = read_kv(pool / "wav.scp")
    u2s = read_kv(pool / "utt2spk")
    by_spk: dict[str, list[str]] = {}
    for u in sorted(u2s):
        by_spk.setdefault(u2s[u], []).append(u)
    spks = [s for s in sorted(by_spk) if len(by_spk[s]) >= 3]  # two to enrol, one at least to speak
    rng = np.random.default_rng(seed)
    order = [spks[i] for i in rng.permutation(len(spks))]
    n_enrol = min(20, len(order) // 2)
    enrolled, strangers = order[:n_enrol], order[n_enrol:]
    work.mkdir(parents=True, exist_ok=True)
    # the gallery: every enrolled speaker's first two utterances, as identify --enrol embeds them
    enrol_utts = {u: s for s in enrolled for u in by_spk[s][:2]}
    rec = Recordings()
    vecs, _ = rec.embed(emb, [wav[u] for u in enrol_utts], progress=False)
    g = Gallery.of(embedder_stamp(emb), {wav[u]: s for u, s in enrol_utts.items()}, vecs, rec.speech)
    gallery = g.save(work / "gallery.npz")
    talk = {s: by_spk[s][2:] for s in enrolled} | {s: by_spk[s] for s in strangers}
    stats = load_statistics("conf/turn_stats_ami.json")
    files, refs = [], {}
    for i in range(meetings):
        k = 2 + i % 3  # 2, 3, 4 speakers
        n_str = 1 + (i % 2 if k > 2 else 0)
        who = [enrolled[j] for j in rng.choice(len(enrolled), k - n_str, replace=False)]
        who += [strangers[j] for j in rng.choice(len(strangers), n_str, replace=False)]
        name = f"{pool.name}_m{i:02d}"
        c = simulate_conversation(
            name, {s: talk[s] for s in who}, lambda u: load_audio(wav[u], 16000, table=True), stats,
            num_speakers=k, duration=60.0, seed=seed, index=i,
        )  # fmt: skip
        sf.write(work / f"{name}.wav", c.wave, 16000, subtype="PCM_16")
        write_rttm(work / f"{name}.rttm", c.turns)
        files.append(work / f"{name}.wav")
        refs[name] = c.turns
    return {"enrolled": enrolled, "strangers": strangers, "gallery": gallery, "files": files, "refs": refs}


def hypotheses(emb: Embedder, m: dict, work: Path, speech: str, clusters: str, pool: Path) -> dict[str, list[Turn]]:
    """Each meeting's named turns: the command's route (``diarize_files``; with ``--domain-mean
    data/<pool>`` for ``domain``), or the reference's clusters named (``reference``)."""
    if clusters != "reference":
        dom = str(pool) if clusters == "domain" else None
        sp = str(work) if speech == "oracle" else speech
        done = diarize_files(emb, m["files"], work / f"rttm.{clusters}", speech=sp, gallery=m["gallery"], domain=dom)
        return {d.rttm.stem: read_rttm(d.rttm).turns for d in done}
    g = Gallery.load(m["gallery"])
    return {
        rec: list(name_clusters(d, ws, x, emb.scoring, g)[0].turns)
        for rec, (d, ws, x) in perfect(emb, m, speech).items()
    }


def perfect(emb: Embedder, m: dict, speech: str) -> dict[str, tuple[Diarization, list, np.ndarray]]:
    """Each meeting's windows clustered by their reference speaker (cached in ``m``)."""
    if "perfect" not in m:
        m["perfect"] = {}
        for f in m["files"]:
            rec, ref = f.stem, m["refs"][f.stem]
            wave = load_audio(str(f), 16000)
            regions = union((t.start, t.end) for t in ref) if speech == "oracle" else speech
            w = embed_windows(wave, 16000, rec, emb.embed_batch, speech=regions)
            owner = window_speakers(w.windows, ref)
            names = sorted(set(owner))
            d = Diarization.of(rec, windows_to_turns(w.windows, [names.index(o) for o in owner], w.regions))
            m["perfect"][rec] = (d, w.windows, w.x)
    return m["perfect"]


def sweep(emb: Embedder, m: dict, speech: str, thresholds: list[float]) -> list[dict[str, object]]:
    """:func:`figures` of perfectly clustered meetings named at each LLR threshold."""
    g = Gallery.load(m["gallery"])
    out = []
    for thr in thresholds:
        hyps = {
            rec: list(name_clusters(d, ws, x, emb.scoring, g, threshold=thr)[0].turns)
            for rec, (d, ws, x) in perfect(emb, m, speech).items()
        }
        out.append(figures(m, hyps))
    return out


def figures(m: dict, hyps: dict[str, list[Turn]]) -> dict[str, object]:
    enrolled = set(m["enrolled"])
    right = wrong = known = stranger_unknown = stranger_total = 0.0
    own_right = own_known = own_unknown = own_stranger = 0.0
    spk_right = spk_known = str_named = str_total = 0
    for rec_id, hyp in hyps.items():
        for s in sorted({t.speaker for t in m["refs"][rec_id]}):
            mine = [t for t in m["refs"][rec_id] if t.speaker == s]
            total = sum(t.duration for t in mine)
            by_hyp = {h: overlap(mine, [t for t in hyp if t.speaker == h]) for h in {t.speaker for t in hyp}}
            own = max(by_hyp, key=by_hyp.__getitem__) if by_hyp else None  # its cluster
            held = by_hyp.get(own, 0.0) if own is not None else 0.0
            if s in enrolled:
                known += total
                right += by_hyp.get(s, 0.0)
                wrong += sum(v for h, v in by_hyp.items() if h != s and not h.startswith("unknown_"))
                spk_known += 1
                spk_right += own == s
                own_known += held
                own_right += held if own == s else 0.0
            else:
                stranger_total += total
                stranger_unknown += sum(v for h, v in by_hyp.items() if h.startswith("unknown_"))
                str_total += 1
                own_stranger += held
                own_unknown += held if own is not None and own.startswith("unknown_") else 0.0
                str_named += any(v > 0.5 * total for h, v in by_hyp.items() if not h.startswith("unknown_"))
    return {
        "enrolled": len(m["enrolled"]),
        "strangers": len(m["strangers"]),
        "right": 100 * right / known,
        "wrong": 100 * wrong / known,
        "unknown": 100 * stranger_unknown / stranger_total,
        "spk": f"{spk_right} of {spk_known}",
        "str": f"{str_named} of {str_total}",
        "own_right": 100 * own_right / max(own_known, 1e-9),
        "own_unknown": 100 * own_unknown / max(own_stranger, 1e-9),
    }


def rescore(work: Path, pool: Path, clusters: str) -> dict[str, object]:
    """:func:`figures` of the hypotheses an earlier run wrote under ``work`` (nothing remade)."""
    refs = {f.stem: read_rttm(f).turns for f in sorted(work.glob("*.rttm"))}
    hyps = {f.stem: read_rttm(f).turns for f in sorted((work / f"rttm.{clusters}").glob("*.rttm"))}
    if not refs or sorted(hyps) != sorted(refs):
        raise SystemExit(f"{work}: no meetings, or not every meeting has a hypothesis in rttm.{clusters}")
    enrolled = sorted(set(Gallery.load(work / "gallery.npz").speakers))
    u2s = read_kv(pool / "utt2spk")
    counts: dict[str, int] = {}
    for s in u2s.values():
        counts[s] = counts.get(s, 0) + 1
    strangers = [s for s, n in counts.items() if n >= 3 and s not in enrolled]  # as make_meetings
    return figures({"enrolled": enrolled, "strangers": strangers, "refs": refs}, hyps)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--pools", default="libri_pool so762_pool")
    p.add_argument("--speech", default="oracle", help="oracle (the meetings' RTTMs), or a detector")
    p.add_argument("--clusters", default="default domain reference", help="default | domain | reference (see above)")
    p.add_argument("--meetings", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--work", default="exp/naming")
    p.add_argument("--sweep", default="", help="LLR thresholds to name perfectly clustered meetings at, e.g. '0 1 2'")
    p.add_argument("--rescore", action="store_true", help="the figures of an earlier run's RTTMs under --work")
    a = p.parse_args()
    if a.rescore:
        print("| pool | speech | clusters | enrolled speech named right | of its cluster | strangers' speech unknown "
              "| of its cluster | enrolled speakers named right | strangers given a name |")  # fmt: skip
        print("|---" * 9 + "|")
        for pool in a.pools.split():
            for c in a.clusters.split():
                r = rescore(Path(a.work) / f"{pool}.{a.speech}", Path("data") / pool, c)
                print(f"| {pool} | {a.speech} | {c} | {r['right']:.1f} | {r['own_right']:.1f} | {r['unknown']:.1f} | "
                      f"{r['own_unknown']:.1f} | {r['spk']} | {r['str']} |")  # fmt: skip
        return 0
    emb = Embedder.from_pretrained(a.model)
    print(f"`{a.model}`, {a.speech} speech, {a.meetings} meetings per pool\n")
    print(
        "| pool | clusters | enrolled / strangers | enrolled speech named right (of its cluster) (%) | "
        "named wrong (%) | strangers' speech unknown (of its cluster) (%) | enrolled speakers named right | "
        "strangers given a name |"
    )
    print("|---|---|---|---|---|---|---|---|")
    pools = {}
    for pool in a.pools.split():
        work = Path(a.work) / f"{pool}.{a.speech}"
        m = pools[pool] = make_meetings(emb, Path("data") / pool, work, a.meetings, a.seed)
        for c in a.clusters.split():
            r = figures(m, hypotheses(emb, m, work, a.speech, c, Path("data") / pool))
            print(
                f"| {pool} | {c} | {r['enrolled']} / {r['strangers']} | {r['right']:.1f} ({r['own_right']:.1f}) | "
                f"{r['wrong']:.1f} | {r['unknown']:.1f} ({r['own_unknown']:.1f}) | {r['spk']} | {r['str']} |",
                flush=True,
            )
    if a.sweep:
        thr = [float(t) for t in a.sweep.split()]
        print("\nNamed at a fixed LLR threshold, the windows clustered perfectly: enrolled speech named right / "
              "strangers' speech unknown (%), and their mean\n")  # fmt: skip
        print("| pool | " + " | ".join(f"LLR > {t:g}" for t in thr) + " |\n|---|" + "---|" * len(thr))
        got = {p: sweep(emb, m, a.speech, thr) for p, m in pools.items()}
        for p, rows in got.items():
            print(f"| {p} | " + " | ".join(f"{r['right']:.1f} / {r['unknown']:.1f}" for r in rows) + " |")
        for p in got:  # leave one pool out: the threshold of the best mean on the others
            score = np.mean([[(r["right"] + r["unknown"]) / 2 for r in got[q]] for q in got if q != p], axis=0)
            i = int(np.argmax(score))
            r = got[p][i]
            print(f"\n{p} left out: LLR > {thr[i]:g} chosen on the others ({score[i]:.1f}); on {p}: named right "
                  f"{r['right']:.1f} %, strangers unknown {r['unknown']:.1f} %")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
