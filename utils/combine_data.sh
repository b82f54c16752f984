#!/usr/bin/env bash
# Combines data directories into a new one; same output files as Kaldi's
# utils/combine_data.sh.
#
# Tables present in every source are concatenated and sorted; utt2uniq and
# segments are created where a source lacks them (segments from utt2dur); spk2utt
# is regenerated; then utils/fix_data_dir.sh runs on the result (unless
# --skip-fix true).  <dest-data-dir> is replaced as a whole, and only once the
# combined directory is complete; it may not be one of the sources.
set -euo pipefail

extra_files=    # more files to combine, e.g. "utt2age utt2accent"
skip_fix=false  # skip fix_data_dir.sh at the end

help_message="Usage: $0 [--extra-files 'file1 file2'] [--skip-fix true] <dest-data-dir> <src-data-dir1> <src-data-dir2> ...
Note, files that don't appear in all source dirs will not be combined,
with the exception of utt2uniq and segments, which are created where necessary."

echo "$0 $*"
. "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/parse_options.sh"

if [ $# -lt 2 ]; then
    printf '%s\n' "${help_message}" >&2
    exit 1
fi

skip=()
if ${skip_fix}; then skip=(--skip-fix); fi

root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/.." && pwd)
. "${root}/utils/spkflow_python.sh"
py=${spkflow_python}
PYTHONPATH=${root}${PYTHONPATH:+:${PYTHONPATH}} exec "${py}" -m spkflow.bin.datadir combine \
    "--extra-files=${extra_files}" ${skip[@]+"${skip[@]}"} -- "$@"
