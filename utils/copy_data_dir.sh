#!/usr/bin/env bash
# Copies a data directory, optionally adding prefixes / suffixes to utterance and
# speaker ids (recording ids stay); same output files as Kaldi's
# utils/copy_data_dir.sh, which it then validates like Kaldi does.
#
# Files in <destdir> that the source does not have are moved to <destdir>/.backup.
set -euo pipefail

spk_prefix=
utt_prefix=
spk_suffix=
utt_suffix=
validate_opts=   # extra options for validate_data_dir.sh (rarely needed)

help_message="Usage: $0 [options] <srcdir> <destdir>
e.g.: $0 --spk-prefix=1- --utt-prefix=1- data/train data/train_1
Options
   --spk-prefix=<prefix>     # Prefix for speaker ids, default empty
   --utt-prefix=<prefix>     # Prefix for utterance ids, default empty
   --spk-suffix=<suffix>     # Suffix for speaker ids, default empty
   --utt-suffix=<suffix>     # Suffix for utterance ids, default empty"

here=$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")
. "${here}/parse_options.sh"

if [ $# -ne 2 ]; then
    printf '%s\n' "${help_message}" >&2
    exit 1
fi
srcdir=$1
destdir=$2

root=$(cd "${here}/.." && pwd)
. "${root}/utils/spkflow_python.sh"
py=${spkflow_python}
PYTHONPATH=${root}${PYTHONPATH:+:${PYTHONPATH}} "${py}" -m spkflow.bin.datadir copy \
    "--utt-prefix=${utt_prefix}" "--utt-suffix=${utt_suffix}" \
    "--spk-prefix=${spk_prefix}" "--spk-suffix=${spk_suffix}" -- "${srcdir}" "${destdir}"

[ -f "${srcdir}/feats.scp" ] || validate_opts="${validate_opts} --no-feats"
[ -f "${srcdir}/text" ] || validate_opts="${validate_opts} --no-text"
# shellcheck disable=SC2086
"${here}/validate_data_dir.sh" ${validate_opts} "${destdir}"
