#!/usr/bin/env bash
# Kaldi data dir from the Free Spoken Digit Dataset (recordings/<digit>_<spk>_<index>.flac|wav,
# 8 kHz: spkflow.audio resamples on reading).  Utterance ids: <spk>-<original stem>; text: the digit.
set -euo pipefail

trials=false           # also write OUT_DATA_DIR/trials
nontarget_ratio=10     # at most this many non-target trials per target trial
trials_seed=0          # seed of the non-target sample
utt2dur=true           # write utt2dur (from audio headers)
download=true          # when CORPUS_DIR is missing, try to clone the public release
download_timeout=30    # seconds allowed to reach the download host

help_message="Usage: $0 [options] CORPUS_DIR OUT_DATA_DIR
  e.g. $0 --trials true \${FSDD} data/fsdd
Options:
  --trials true|false      (default: ${trials})
  --nontarget-ratio R      (default: ${nontarget_ratio})
  --trials-seed S          (default: ${trials_seed})
  --utt2dur true|false     (default: ${utt2dur})
  --download true|false    (default: ${download})
  --download-timeout SEC   (default: ${download_timeout})"

. "$(dirname "${BASH_SOURCE[0]}")/corpus_common.sh"
. "${spkflow_root}/utils/parse_options.sh"

if [ $# -ne 2 ]; then
    printf '%b\n' "${help_message}" >&2
    exit 1
fi

ensure_corpus "$1" recordings FSDD https://github.com/Jakobovski/free-spoken-digit-dataset
prepare fsdd "$1" "$2"
