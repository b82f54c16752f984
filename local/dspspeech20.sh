#!/usr/bin/env bash
# Kaldi data dir from DSPSpeech-20 (speech_data/<spk>/<spk>-<word>-<round>.flac|wav).
# Utterance ids are the file stems (already speaker-prefixed); speaker 15307130191 is left out
# by default (most of its files are byte-identical copies); --rounds keeps some rounds only.
set -euo pipefail

rounds=                # rounds to keep, e.g. "01 02" (default: all)
exclude_speakers=15307130191  # speakers to leave out
trials=false           # also write OUT_DATA_DIR/trials
nontarget_ratio=10     # at most this many non-target trials per target trial
trials_seed=0          # seed of the non-target sample
utt2dur=true           # write utt2dur (from audio headers)
download=true          # when CORPUS_DIR is missing, try to clone the public release
download_timeout=30    # seconds allowed to reach the download host

help_message="Usage: $0 [options] CORPUS_DIR OUT_DATA_DIR
  e.g. $0 --rounds \"01 02\" --trials true \${DSPSPEECH20} data/dsp20
Options:
  --rounds \"R1 R2 ..\"     (default: all)
  --exclude-speakers \"S ..\" (default: ${exclude_speakers})
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

ensure_corpus "$1" speech_data DSPSPEECH20 https://github.com/zhongyuchen/DSPSpeech-20
prepare dspspeech20 "$1" "$2" --rounds "${rounds}" --exclude-speakers "${exclude_speakers}"
