#!/usr/bin/env bash
# Makes a data directory holding a subset of another one; same output files as
# Kaldi's utils/subset_data_dir.sh.
#
#   subset_data_dir.sh [--speakers|--shortest|--first|--last|--per-spk] <srcdir> <num-utt> <destdir>
#   subset_data_dir.sh --spk-list <speaker-list-file> <srcdir> <destdir>
#   subset_data_dir.sh --utt-list <utt-list-file> <srcdir> <destdir>
#
# Without an option, <num-utt> utterances spread evenly through utt2spk are kept.
# --per-spk keeps <num-utt> utterances of every speaker (all of a speaker with
# fewer); --speakers picks random speakers (Kaldi's fixed seed) until there are
# <num-utt> utterances; --shortest keeps the shortest (utt2num_frames or
# feats.scp); --first / --last keep the first / last lines of utt2spk.  Every
# table of <srcdir> is filtered to match and written atomically to <destdir>.
# A key twice in a table it reads (Kaldi's script copies both lines) is an error
# naming file and line; then nothing is written.
set -euo pipefail

usage() {
    cat <<EOM
Usage:
  $0 [--speakers|--shortest|--first|--last|--per-spk] <srcdir> <num-utt> <destdir>
  $0 --spk-list <speaker-list-file> <srcdir> <destdir>
  $0 --utt-list <utt-list-file> <srcdir> <destdir>
By default, selects <num-utt> utterances spread evenly through the data directory.
With --speakers, randomly selects enough speakers that we have <num-utt> utterances
With --per-spk, selects <num-utt> utterances per speaker, if available.
With --first, selects the first <num-utt> utterances
With --last, selects the last <num-utt> utterances
With --shortest, selects the shortest <num-utt> utterances.
With --spk-list, reads the speakers to keep from <speaker-list-file>
With --utt-list, reads the utterances to keep from <utt-list-file>
EOM
}

mode=--spread
list=
expect_args=3
case "${1:-}" in
    --first|--last|--per-spk|--shortest|--speakers) mode=$1; shift ;;
    --spk-list|--utt-list)
        mode=$1
        if [ $# -lt 2 ]; then usage >&2; exit 1; fi
        list=$2; shift 2; expect_args=2 ;;
    --help|-h) usage; exit 0 ;;
    --*) echo "$0: invalid option '$1'" >&2; usage >&2; exit 1 ;;
esac
if [ $# -ne ${expect_args} ]; then usage >&2; exit 1; fi

if [ ${expect_args} -eq 2 ]; then
    args=("${mode}=${list}" -- "$1" "$2")
else
    if ! [[ "$2" =~ ^[0-9]+$ ]]; then
        echo "$0: <num-utt> must be a positive integer, got '$2'" >&2; exit 1
    fi
    args=("${mode}=$2" -- "$1" "$3")
fi

root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
. "${root}/utils/spkflow_python.sh"
py=${spkflow_python}
PYTHONPATH=${root}${PYTHONPATH:+:${PYTHONPATH}} exec "${py}" -m spkflow.bin.datadir subset "${args[@]}"
