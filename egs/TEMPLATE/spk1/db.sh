# shellcheck shell=bash
# Where the corpora live. Point a variable at your copy, e.g.
#   export SPEECHOCEAN762=/data/speechocean762
# The defaults use ../shared/corpora next to the project when it exists.
_spkflow_root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../../.." && pwd)
_spkflow_shared=$(cd "${_spkflow_root}/.." && pwd)/shared/corpora

SPEECHOCEAN762=${SPEECHOCEAN762:-${_spkflow_shared}/speechocean762}
DSPSPEECH20=${DSPSPEECH20:-${_spkflow_shared}/dspspeech20}
FSDD=${FSDD:-${_spkflow_shared}/fsdd}
LIBRISPEECH=${LIBRISPEECH:-${_spkflow_shared}/librispeech_mini}
AMI_EXCERPTS=${AMI_EXCERPTS:-${_spkflow_shared}/ami_excerpts}  # audio/<uri>.flac + debug.{train,development,test}.{rttm,uem}
# VoxCeleb recipe (egs/voxceleb/spk1; not in ../shared/corpora: point these at your downloads).
VOXCELEB1=${VOXCELEB1:-${_spkflow_shared}/voxceleb1}      # wav/idXXXXX/<video>/NNNNN.wav + veri_test2.txt ...
VOXCELEB2=${VOXCELEB2:-${_spkflow_shared}/voxceleb2}      # dev/aac/idXXXXX/<video>/NNNNN.m4a
MUSAN=${MUSAN:-${_spkflow_shared}/musan}                  # noise/ music/ speech/ (openslr.org/17)
RIRS_NOISES=${RIRS_NOISES:-${_spkflow_shared}/RIRS_NOISES}  # simulated_rirs/{small,medium,large}room/ (openslr.org/28)
unset _spkflow_root _spkflow_shared
