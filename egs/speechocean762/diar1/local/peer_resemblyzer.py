#!/usr/bin/env python3
"""Embed a set's diarization windows with Resemblyzer (a public pretrained GE2E LSTM), so that stages
4-5 of diar.sh cluster and score them exactly as the model's own: the peer embedder of RESULTS.md.

Run it with the spk1 recipe's comparison environment (``../spk1/local/setup_resemblyzer.sh`` makes
``../spk1/.venv_resemblyzer``), after stage 2 wrote the windows:

    ../spk1/.venv_resemblyzer/bin/python local/peer_resemblyzer.py --sets "sim ami"
    ./run.sh --stage 4 --tag peer_resemblyzer --spk_model none

Each window (``dump/<set>.<windows>/windows``: wav.scp + segments, read by spkflow's AudioReader)
is volume-normalised as Resemblyzer's ``preprocess_wav`` does (-30 dBFS, increase only; no
silence trimming: the windows are speech) and embedded as ``embed_utterance`` embeds a clip of at
most one partial (its 40-band mel spectrogram padded to the 160 frames of a partial, the LSTM, L2
normalisation), in batches of 64 -> ``exp/diar_peer_resemblyzer/embed/<set>.<windows>/xvector.scp``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

log = logging.getLogger("peer_resemblyzer")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sets", default="sim ami")
    p.add_argument("--windows", default="oracle_w1.5s0.75", help="the windows' tag: <speech>_w<window>s<shift>")
    p.add_argument("--dumpdir", default="dump")
    p.add_argument("--exp", default="exp/diar_peer_resemblyzer")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s (%(name)s) %(levelname)s: %(message)s")
    import kaldiio
    import numpy as np
    import torch
    from resemblyzer import VoiceEncoder
    from resemblyzer.audio import audio_norm_target_dBFS, normalize_volume, wav_to_mel_spectrogram
    from resemblyzer.hparams import partials_n_frames

    from spkflow.data.audio import AudioReader

    encoder = VoiceEncoder("cpu", verbose=False)
    for dset in args.sets.split():
        wdir = os.path.join(args.dumpdir, f"{dset}.{args.windows}", "windows")
        out = os.path.join(args.exp, "embed", f"{dset}.{args.windows}")
        os.makedirs(out, exist_ok=True)
        reader = AudioReader(wdir, sample_rate=16000)
        t0 = time.time()
        scp = os.path.join(out, "xvector.scp")
        keys = reader.keys()
        with kaldiio.WriteHelper(f"ark,scp:{out}/xvector.ark,{scp}.tmp") as w:
            for i in range(0, len(keys), 64):
                mels = []
                for key in keys[i : i + 64]:
                    mel = wav_to_mel_spectrogram(
                        normalize_volume(reader.read(key), audio_norm_target_dBFS, increase_only=True)
                    )
                    mel = mel[:partials_n_frames]
                    mels.append(np.pad(mel, ((0, partials_n_frames - len(mel)), (0, 0))))
                with torch.inference_mode():
                    emb = encoder(torch.from_numpy(np.stack(mels)).float()).numpy()
                for key, e in zip(keys[i : i + 64], emb, strict=True):
                    w(key, (e / np.linalg.norm(e)).astype(np.float32))
        os.replace(f"{scp}.tmp", scp)
        log.info("%s: %d windows in %.1f s -> %s", dset, len(reader), time.time() - t0, scp)
    return 0


if __name__ == "__main__":
    sys.exit(main())
