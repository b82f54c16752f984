"""Say which sample rates a data dir's recordings have, and warn about those below a model's rate.

    python -m spkflow.bin.audio_rates (--rate 16000 | --model-dir exp/spk_x | --fbank-conf conf/fbank.conf) DATA_DIR

Stages 2 (``scripts/feats/make_fbank.sh``) and 5 (``scripts/spk/extract_embeddings.sh``) run it
before their jobs: recordings below the rate are upsampled there, and an 8 kHz file in a 16 kHz
set has no energy above 4 kHz (the same recording at 8 and 16 kHz scores only ~0.8 cosine with
the demo model), so they are named here, not resampled without a word.  Rates come from file
headers (:func:`spkflow.data.durations.native_rates`; at most 20,000 recordings, spread evenly).
Always exits 0 unless the data dir cannot be read (status 1, the file named).
"""

from __future__ import annotations

import argparse
import logging
import sys

from spkflow.bin import exits_on, setup_logging
from spkflow.bin.argtypes import int_at_least
from spkflow.core.errors import InputError
from spkflow.data.durations import native_rates
from spkflow.embed.packed import model_sample_rate
from spkflow.features.fbank import FbankOptions


@exits_on(InputError, OSError, ValueError)
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m spkflow.bin.audio_rates", description=__doc__.split("\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--rate", type=int_at_least(1), help="the rate the features are computed at")
    src.add_argument("--model-dir", help="a model dir or pack: its fbank's rate")
    src.add_argument("--fbank-conf", help="a Kaldi fbank option file: its --sample-frequency")
    p.add_argument("data_dir")
    args = p.parse_args(argv)
    setup_logging()
    if args.rate:
        want = args.rate
    elif args.model_dir:
        want = model_sample_rate(args.model_dir)
    else:
        want = int(FbankOptions.from_kaldi_conf(args.fbank_conf).sample_frequency)
    rates, checked, unknown = native_rates(args.data_dir)
    seen = ", ".join(f"{r} Hz x {len(u)}" for r, u in sorted(rates.items())) or "none known"
    note = f", {unknown} unknown (pipes or unreadable headers)" if unknown else ""
    logging.info("%s: sample rates of %d recordings: %s%s", args.data_dir, checked, seen, note)
    for rate, utts in sorted(rates.items()):
        if rate < want:
            logging.warning(
                "%s: %d recording(s) at %d Hz, below the model's %d Hz: upsampled, with no energy above %d Hz "
                "(e.g. %s)",
                args.data_dir,
                len(utts),
                rate,
                want,
                rate // 2,
                ", ".join(utts[:3]),
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
