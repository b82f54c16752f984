#!/usr/bin/env bash
# Checks a Kaldi data directory; same verdicts as Kaldi's utils/validate_data_dir.sh.
#
# Checked: utt2spk and spk2utt exist, are sorted (LC_ALL=C) with unique keys and
# agree; utt2spk is sorted by speaker too (unless --no-spk-sort); text (unless
# --no-text), wav.scp (unless --no-wav; or segments + wav.scp), feats.scp (unless
# --no-feats), and, when present, vad.scp, utt2dur, utt2num_frames, utt2lang,
# utt2uniq, utt2warp, cmvn.scp, spk2gender, spk2warp, reco2dur,
# reco2file_and_channel list exactly the utterances / speakers / recordings.
# Utterance, speaker and recording ids must be UTF-8 (Kaldi lets other bytes pass; spkflow's
# feature and embedding arks cannot store them); paths and transcripts may hold any bytes.
# The first problem is reported as "<file>:<line>: <what is wrong>" (exit 1).
#
# Kaldi's defaults are kept: a data dir without text needs --no-text, one without
# feats.scp needs --no-feats.  Speaker recipes (which have no text and get
# features later, in dump/) call it as:
#     utils/validate_data_dir.sh --no-text --no-feats data/train
set -euo pipefail

usage() {
    cat <<EOM
Usage: $0 [--no-feats] [--no-text] [--non-print] [--no-wav] [--no-spk-sort] <data-dir>
The --no-xxx options mean that the script does not require xxx to be present,
but it will check it if it is present.
  --no-spk-sort  utt2spk need not be sorted by speaker-id as well as by utterance-id
                 (it is, when speaker-ids are prefixes of the utterance-ids)
  --non-print    allow non-printable characters in text
e.g.: $0 --no-text --no-feats data/train
EOM
}

flags=()
data=
while [ $# -ne 0 ]; do
    case "$1" in
        --no-feats|--no-text|--non-print|--no-wav|--no-spk-sort) flags+=("$1") ;;
        --help|-h) usage; exit 0 ;;
        -*) echo "$0: unknown option $1" >&2; usage >&2; exit 1 ;;
        *)
            if [ -n "${data}" ]; then usage >&2; exit 1; fi
            data=$1 ;;
    esac
    shift
done
if [ -z "${data}" ]; then usage >&2; exit 1; fi

root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
. "${root}/utils/spkflow_python.sh"
py=${spkflow_python}
PYTHONPATH=${root}${PYTHONPATH:+:${PYTHONPATH}} exec "${py}" -m spkflow.bin.datadir validate \
    "--name=$0" ${flags[@]+"${flags[@]}"} -- "${data}"
