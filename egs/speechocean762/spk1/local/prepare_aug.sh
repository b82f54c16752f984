#!/usr/bin/env bash
# Offline augmentation sources for conf/tuning/train_aug.yaml (no network: simulated or generated once):
#   data/aug_rirs   simulated room impulse responses (pyroomacoustics image-source shoebox rooms)
#   data/aug_noise  coloured noise (white, pink, brown)
# Babble needs nothing here: conf/tuning/train_aug.yaml mixes other training speakers (data/train).
# A data dir that already has a wav.scp is kept (delete it to make it again).
set -euo pipefail

log() {
    local fname=${BASH_SOURCE[1]##*/}
    echo -e "$(date '+%Y-%m-%dT%H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*"
}

num_rirs=200          # simulated rooms
rt60="0.2 0.8"        # RT60 range of the rooms (s)
num_noise=60          # coloured-noise recordings
noise_seconds=10      # length of each
seed=0                # seed of both
rirs_dir=data/aug_rirs
noise_dir=data/aug_noise

help_message="Usage: $0 [--num-rirs ${num_rirs}] [--rt60 \"${rt60}\"] [--num-noise ${num_noise}] [--noise-seconds ${noise_seconds}] [--seed ${seed}] [--rirs-dir DIR] [--noise-dir DIR]"

. utils/parse_options.sh
if [ $# -ne 0 ]; then
    echo "${help_message}" >&2
    exit 1
fi

. ./path.sh

if [ -f "${rirs_dir}/wav.scp" ]; then
    log "${rirs_dir} exists: kept"
else
    log "Simulating ${num_rirs} RIRs -> ${rirs_dir}"
    # shellcheck disable=SC2086
    python -m spkflow.bin.make_rirs --num "${num_rirs}" --seed "${seed}" --rt60 ${rt60} --out "${rirs_dir}"
fi
if [ -f "${noise_dir}/wav.scp" ]; then
    log "${noise_dir} exists: kept"
else
    log "Generating ${num_noise} coloured-noise recordings -> ${noise_dir}"
    python -m spkflow.bin.make_noise --num "${num_noise}" --seconds "${noise_seconds}" --seed "${seed}" --out "${noise_dir}"
fi
log "Successfully finished: ${rirs_dir}, ${noise_dir}"
