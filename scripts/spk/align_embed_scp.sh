#!/usr/bin/env bash
# Align embedding scp files with a data dir: filter to its keys, sort in its LC_ALL=C order, verify.
#
#   scripts/spk/align_embed_scp.sh [--check-only true] DATA_DIR SCP [SCP ...]
#   e.g. scripts/spk/align_embed_scp.sh data/train dump/xvector/train/xvector.scp \
#            dump/xvector/train/spk_xvector.scp
#
# Each SCP keeps only the keys of DATA_DIR (its utterances from utt2spk, or its speakers from
# spk2utt for a file of speaker ids such as spk_xvector.scp), sorted in the data dir's order, and
# then must list every key: otherwise the first differing line is reported, the file is left as
# it was, and the exit status is 1.  The data dir is only read (never re-sorted), no set names
# are assumed, and no `text` file is needed.  Each SCP is replaced atomically.
set -euo pipefail

root=$(cd -P "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
. "${root}/utils/supervise.sh"  # a signal to this pid stops everything the script starts
export PYTHONPATH=${root}${PYTHONPATH:+:${PYTHONPATH}}
export LC_ALL=C

check_only=false    # only verify, do not rewrite the files
python=             # python interpreter (default: utils/spkflow_python.sh: $SPKFLOW_PYTHON, python, .venv)

help_message=$(cat <<EOF2
Usage: $0 [--check-only false] <data-dir> <scp> [<scp> ...]
  Filters each scp to the data dir's keys, sorts it in the data dir's LC_ALL=C order and verifies
  it line by line (reporting the first mismatch).
EOF2
)

. "${root}/utils/parse_options.sh"

if [ $# -lt 2 ]; then
    echo "${help_message}" >&2
    exit 1
fi
spkflow_python=${python}   # --python wins; else utils/spkflow_python.sh chooses
. "${root}/utils/spkflow_python.sh"
python=${spkflow_python}
data=$1
shift
if [ ! -s "${data}/utt2spk" ]; then
    echo "$0: ${data}/utt2spk does not exist or is empty" >&2
    exit 1
fi
opt=
[ "${check_only}" = true ] && opt=--check-only
exec "${python}" -m spkflow.bin.align_embed_scp ${opt} "${data}" "$@"
