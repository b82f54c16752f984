# Where the corpora live. Point a variable at your copy, e.g.
#   export SPEECHOCEAN762=/data/speechocean762
# The defaults use ../shared/corpora next to the project when it exists.
_spkflow_root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../../.." && pwd)
_spkflow_shared=$(cd "${_spkflow_root}/.." && pwd)/shared/corpora

SPEECHOCEAN762=${SPEECHOCEAN762:-${_spkflow_shared}/speechocean762}
DSPSPEECH20=${DSPSPEECH20:-${_spkflow_shared}/dspspeech20}
FSDD=${FSDD:-${_spkflow_shared}/fsdd}
LIBRISPEECH=${LIBRISPEECH:-${_spkflow_shared}/librispeech_mini}
unset _spkflow_root _spkflow_shared
