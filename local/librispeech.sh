#!/usr/bin/env bash
# Kaldi data dir from LibriSpeech's layout (<subset>/<spk>/<chapter>/<spk>-<chapter>-<utt>.flac|wav):
# the full corpus (CORPUS_DIR = LibriSpeech/, or one subset folder) or ../shared/corpora/librispeech_mini.
# text from *.trans.txt and spk2gender from SPEAKERS.TXT when present.  No automatic download
# (the release is a set of large tarballs: openslr.org/12).
set -euo pipefail

subsets=               # subsets to include, e.g. "train-clean-100 train-clean-360" (default: all found)
trials=false           # also write OUT_DATA_DIR/trials
nontarget_ratio=10     # at most this many non-target trials per target trial
trials_seed=0          # seed of the non-target sample
utt2dur=true           # write utt2dur (from audio headers)
download=false         # (no download for LibriSpeech; kept for a uniform interface)
download_timeout=30

help_message="Usage: $0 [options] CORPUS_DIR OUT_DATA_DIR
  e.g. $0 --subsets test-clean --trials true \${LIBRISPEECH} data/test_clean
Options:
  --subsets \"S1 S2 ..\"    (default: every subset under CORPUS_DIR)
  --trials true|false      (default: ${trials})
  --nontarget-ratio R      (default: ${nontarget_ratio})
  --trials-seed S          (default: ${trials_seed})
  --utt2dur true|false     (default: ${utt2dur})"

. "$(dirname "${BASH_SOURCE[0]}")/corpus_common.sh"
. "${spkflow_root}/utils/parse_options.sh"

if [ $# -ne 2 ]; then
    printf '%b\n' "${help_message}" >&2
    exit 1
fi
if [ ! -d "$1" ]; then
    log "Error: LibriSpeech not found at LIBRISPEECH=$1. Point LIBRISPEECH at a copy (the folder" \
        "holding train-clean-100/ etc.): export LIBRISPEECH=/path/to/LibriSpeech, or edit db.sh; download from https://www.openslr.org/12"
    exit 1
fi
prepare librispeech "$1" "$2" ${subsets:+--subsets "${subsets}"}
