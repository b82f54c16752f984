#!/usr/bin/env bash
# Makes a Kaldi data directory consistent; same output files as Kaldi's
# utils/fix_data_dir.sh.
#
# Sorts every table (LC_ALL=C, first of duplicate keys kept), keeps the speakers
# present in spk2gender / cmvn.scp when those exist, keeps the utterances present
# in all of utt2spk, feats.scp, text, segments, utt2lang, wav.scp and utt2dur /
# utt2num_frames (positive values), filters every other utterance-, speaker- and
# recording-indexed table to match, regenerates spk2utt, and reports kept/total.
# Each file it changes is first copied, unmodified, to <data-dir>/.backup/.
# On bad input (e.g. a utt2spk line without 2 fields) it stops with
# "<file>:<line>: ..." and changes nothing.
set -euo pipefail

utt_extra_files=   # more utterance-indexed files to filter, e.g. "utt2age utt2accent"
spk_extra_files=   # more speaker-indexed files to filter

help_message="Usage: $0 [--utt-extra-files 'f1 f2'] [--spk-extra-files 'f3'] <data-dir>
e.g.: $0 data/train
Makes sure the files of a data dir are sorted and list the same utterances,
removing for example utterances that have no features (if feats.scp is present)."

. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/parse_options.sh"

if [ $# -ne 1 ]; then
    printf '%s\n' "${help_message}" >&2
    exit 1
fi

root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
. "${root}/utils/spkflow_python.sh"
py=${spkflow_python}
PYTHONPATH=${root}${PYTHONPATH:+:${PYTHONPATH}} exec "${py}" -m spkflow.bin.datadir fix \
    "--utt-extra-files=${utt_extra_files}" "--spk-extra-files=${spk_extra_files}" -- "$1"
