#!/usr/bin/env bash
# VoxCeleb speaker embedder: train on VoxCeleb2 dev (5,994 speakers), evaluate on the cleaned
# Vox1-O / Vox1-E / Vox1-H trial lists (EER, minDCF), AS-norm with a VoxCeleb2-dev cohort.
# Corpora: VOXCELEB1, VOXCELEB2, MUSAN, RIRS_NOISES in db.sh (or the environment). README.md
# says what a full run costs; `--train_config conf/train_smoke.yaml` runs every stage on CPU.
set -euo pipefail
if [ ! -e ./spk.sh ]; then  # relative links and paths: the recipe runs from its own folder
    echo "$0: run it from its folder: cd $(dirname "$0") && ./run.sh" >&2
    exit 1
fi
. utils/supervise.sh  # a signal to this pid stops everything the run starts (spkflow.core.procs)

train_set=vox2_dev                    # vox12: VoxCeleb2 dev + VoxCeleb1 dev (add --local_data_opts "--vox12 true")
test_sets="vox1_o vox1_e vox1_h"      # one data dir per official list (utterances it names + its trials)
train_config=conf/train_ecapa_c512_aam.yaml
# 64 speakers x 2 utterances = 128 utterances per batch and GPU (WeSpeaker's batch per GPU; the
# config's lr is scaled to the global batch); an epoch uses every training utterance at most once
# (1.09 M crops), so 150 epochs are WeSpeaker's 150 (README.md: hours, disk).
num_spk=64
num_utt=2
num_epochs=150
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)   # every visible GPU (0: CPU)
nj=$(nproc)                           # feature and embedding extraction jobs
score_norm=true                       # AS-norm, cohort = speaker means of ${train_set}
cohort_size=300                       # top-300 cohort (WeSpeaker)
score_center=true                     # subtract the training speakers' mean embedding first
score_qmf=true                        # QMF: scores calibrated with durations, embedding norms, cohort means (WeSpeaker stage 7)
qmf_trials=20000                      # QMF: target trials drawn from ${train_set}, and as many non-target
fbank_compress=true                   # Kaldi-compressed arks: ~60 MB per hour of audio instead of ~118 (measured; error ~3e-4)

gpu_inference=false
[ "${ngpu}" -gt 0 ] && gpu_inference=true

./spk.sh \
    --train_set "${train_set}" \
    --test_sets "${test_sets}" \
    --train_config "${train_config}" \
    --num_spk "${num_spk}" \
    --num_utt "${num_utt}" \
    --num_epochs "${num_epochs}" \
    --ngpu "${ngpu}" \
    --gpu_inference "${gpu_inference}" \
    --nj "${nj}" \
    --score_norm "${score_norm}" \
    --cohort_size "${cohort_size}" \
    --score_center "${score_center}" \
    --score_qmf "${score_qmf}" \
    --qmf_trials "${qmf_trials}" \
    --fbank_compress "${fbank_compress}" \
    "$@"
