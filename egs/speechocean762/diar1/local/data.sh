#!/usr/bin/env bash
# Data preparation of the diarization demo (stage 1 of diar.sh), recording dirs (wav.scp, rttm, uem, reco2dur):
#   data/sim   conversations simulated from LibriSpeech mini (8 speakers the demo model never saw),
#              2-6 speakers each, with the turn-taking of AMI meetings (conf/turn_stats_ami.json)
#   data/sim_so762  the same from speechocean762's 125 test speakers (unseen in training: the demo
#              model trains on the train speakers and averages its last epochs, no selection on test)
#   data/ami   the 14 AMI excerpts of 30 s (real meetings; reference RTTM and UEM as shipped)
# Corpus locations come from db.sh (LIBRISPEECH, SPEECHOCEAN762, AMI_EXCERPTS); nothing is copied
# into the repository: wav.scp names the corpus files (AMI) or the simulated audio under data/<set>/audio.
set -euo pipefail

log() {
    local fname=${BASH_SOURCE[1]##*/}
    echo -e "$(date '+%Y-%m-%dT%H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*"
}

sim_recordings=10        # conversations per simulated set
sim_duration=60          # seconds per conversation (at least)
sim_min_speakers=2       # speakers per conversation: cycling from min to max
sim_max_speakers=6
sim_seed=0               # seed of the simulation (same seed, same audio and RTTM)
stats=conf/turn_stats_ami.json   # turn-taking statistics (python -m spkflow.bin.turn_statistics)
so762=true               # also simulate data/sim_so762 from speechocean762's test speakers

help_message="Usage: $0 [--sim_recordings 10] [--sim_duration 60] [--sim_seed 0] [--so762 true]"

. utils/parse_options.sh
if [ $# -ne 0 ]; then
    printf '%b\n' "${help_message}" >&2
    exit 1
fi

. ./path.sh
. ./db.sh

sim() {  # sim POOL_DIR SET PREFIX: simulated conversations of POOL_DIR's speakers into data/SET
    python -m spkflow.bin.simulate_conversations --stats "${stats}" --num-recordings "${sim_recordings}" \
        --duration "${sim_duration}" --min-speakers "${sim_min_speakers}" --max-speakers "${sim_max_speakers}" \
        --seed "${sim_seed}" --prefix "$3" "$1" "data/$2/audio" "data/$2"
}

log "LibriSpeech mini from LIBRISPEECH=${LIBRISPEECH} -> data/libri_pool -> data/sim"
python -m spkflow.bin.prepare_corpus librispeech "${LIBRISPEECH}" data/libri_pool
sim data/libri_pool sim libri

if ${so762}; then
    log "speechocean762 test speakers from SPEECHOCEAN762=${SPEECHOCEAN762} -> data/so762_pool -> data/sim_so762"
    python -m spkflow.bin.prepare_corpus speechocean762 --download false --split test "${SPEECHOCEAN762}" data/so762_pool
    sim data/so762_pool sim_so762 so762
fi

log "AMI excerpts from AMI_EXCERPTS=${AMI_EXCERPTS} -> data/ami"
if [ ! -d "${AMI_EXCERPTS}/audio" ]; then
    log "Error: ${AMI_EXCERPTS}/audio not found (set AMI_EXCERPTS in db.sh)"
    exit 1
fi
mkdir -p data/ami
_root=$(cd "${AMI_EXCERPTS}" && pwd)
for _f in "${_root}"/audio/*.flac; do
    echo "$(basename "${_f}" .flac) ${_f}"
done | sort > data/ami/wav.scp
cat "${_root}"/debug.*.rttm | sort -k2,2 -k4,4n > data/ami/rttm
cat "${_root}"/debug.*.uem | sort > data/ami/uem
rm -f data/ami/reco2dur  # measured again by stage 1's check
log "Successfully finished: data/{sim,$(${so762} && echo sim_so762,)ami}"
