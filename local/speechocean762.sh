#!/usr/bin/env bash
# Kaldi data dir from one official split of speechocean762 (125 train / 125 test speakers).
# Utterance ids become <spk>-<original id>, paths absolute, files LC_ALL=C sorted; utt2dur,
# text and spk2gender kept; with --trials true also a trials list (all target pairs plus a
# seeded sample of at most nontarget_ratio non-target pairs per target pair).
set -euo pipefail

split=train            # official split: train | test
trials=false           # also write OUT_DATA_DIR/trials
nontarget_ratio=10     # at most this many non-target trials per target trial
trials_seed=0          # seed of the non-target sample
utt2dur=true           # write utt2dur (from audio headers)
download=true          # when CORPUS_DIR is missing, try to clone the public release
download_timeout=30    # seconds allowed to reach the download host

help_message="Usage: $0 [options] CORPUS_DIR OUT_DATA_DIR
  e.g. $0 --split test --trials true \${SPEECHOCEAN762} data/test
Options:
  --split train|test       (default: ${split})
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
case "${split}" in train|test) ;; *) log "Error: --split must be train or test, got '${split}'"; exit 1 ;; esac

ensure_corpus "$1" "${split}/wav.scp" SPEECHOCEAN762 https://github.com/jimbozhang/speechocean762
prepare speechocean762 "$1" "$2" --split "${split}"
