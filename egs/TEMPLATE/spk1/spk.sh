#!/usr/bin/env bash
# Staged driver for speaker-embedder recipes (ESPnet/Kaldi conventions).
# A recipe's run.sh passes options; every stage reads and writes files only.
#
#   ./run.sh --stage 2 --stop_stage 5 --nj 8
#
# Stages: 1 data prep, 2 fbank + VAD, 3 N x M batch lists, 4 training,
#         5 embedding extraction, 6 scoring (EER, minDCF, plots).
set -euo pipefail

log() {
    local fname=${BASH_SOURCE[1]##*/}
    echo -e "$(date '+%Y-%m-%dT%H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*"
}
SECONDS=0

# General options.
stage=1               # first stage to run
stop_stage=10000      # last stage to run
nj=4                  # parallel jobs for feature and embedding extraction
ngpu=0                # GPUs for training: 0 = CPU, 1 = one GPU, >1 = torchrun DDP
nproc=1               # training processes when ngpu=0 (>1: CPU DDP with gloo through torchrun)
gpu_inference=false   # extract embeddings on GPU (one GPU per job)
expdir=exp            # where experiments go
dumpdir=dump          # where features go

# Data options.
train_set=train       # training data dir under data/
test_sets="test"      # evaluation data dirs under data/ (each with a trials file)
valid_set=            # data dir with trials used for validation EER during training (default: first test set)
local_data_opts=      # options passed to local/data.sh

# Feature options (stage 2).
fbank_conf=conf/fbank.conf   # Kaldi-style fbank options, one --opt=value per line
vad_conf=conf/vad.conf       # energy VAD options
skip_bad=false               # leave out unreadable utterances (listed in bad_utts) instead of failing

# Batch options (stage 3).
num_spk=32            # N speakers per batch
num_utt=6             # M utterances per speaker
num_epochs=10         # epochs to plan and train
batch_seed=0          # seed of the batch plan
short_speakers=drop   # speakers with fewer than num_utt utterances: drop | repeat

# Training options (stage 4).
train_config=conf/train.yaml  # model, loss, optimiser, loader
tag=                  # experiment tag (default: derived from train_config)
resume=true           # continue from the last checkpoint in exp/<tag>

# Embedding options (stage 5).
embed_sets=           # data dirs to embed (default: test sets and valid set)
embed_batch_size=32   # utterances per batch in extraction
extract_train=false   # also embed the training set (as a TTS recipe would)

# Scoring options (stage 6).
score_norm=false      # adaptive s-norm with a cohort from the training set
cohort_size=200       # cohort speakers for score normalisation

help_message=$(cat <<EOM
Usage: $0 [options]
  --stage / --stop_stage   stages to run (1 data, 2 fbank, 3 batches, 4 train, 5 embed, 6 score)
  --nj, --ngpu, --nproc    parallelism
  --train_set, --test_sets, --valid_set
  --fbank_conf, --vad_conf, --skip_bad
  --num_spk, --num_utt, --num_epochs, --batch_seed, --short_speakers
  --train_config, --tag, --resume
  --embed_sets, --embed_batch_size, --gpu_inference, --extract_train
  --score_norm, --cohort_size
EOM
)

log "$0 $*"
run_args=$(printf '%q ' "$0" "$@")
. utils/parse_options.sh

if [ $# -ne 0 ]; then
    log "${help_message}"
    log "Error: unknown arguments: $*"
    exit 2
fi

. ./path.sh
. ./cmd.sh

[ -z "${tag}" ] && tag=$(basename "${train_config}" .yaml)
spk_exp=${expdir}/spk_${tag}
[ -z "${valid_set}" ] && valid_set=${test_sets%% *}
[ -z "${embed_sets}" ] && embed_sets=$(echo "${test_sets} ${valid_set}" | tr ' ' '\n' | awk 'NF && !seen[$0]++' | tr '\n' ' ')
${extract_train} && embed_sets="${train_set} ${embed_sets}"

not_implemented() {
    log "Error: stage $1 ($2) is not implemented yet"
    exit 1
}

if [ ${stage} -le 1 ] && [ ${stop_stage} -ge 1 ]; then
    log "Stage 1: data preparation (local/data.sh) into data/{${train_set},${test_sets// /,}}"
    not_implemented 1 "data preparation"
fi

if [ ${stage} -le 2 ] && [ ${stop_stage} -ge 2 ]; then
    log "Stage 2: fbank + energy VAD with ${fbank_conf}, ${nj} jobs: data/<set> -> ${dumpdir}/fbank/<set>"
    not_implemented 2 "feature extraction"
fi

if [ ${stage} -le 3 ] && [ ${stop_stage} -ge 3 ]; then
    log "Stage 3: ${num_spk} x ${num_utt} batch lists for ${num_epochs} epochs -> ${spk_exp}/batches"
    not_implemented 3 "batch lists"
fi

if [ ${stage} -le 4 ] && [ ${stop_stage} -ge 4 ]; then
    log "Stage 4: training with ${train_config} -> ${spk_exp}"
    not_implemented 4 "training"
fi

if [ ${stage} -le 5 ] && [ ${stop_stage} -ge 5 ]; then
    log "Stage 5: embedding extraction for ${embed_sets} -> ${spk_exp}/embed/<set>"
    not_implemented 5 "embedding extraction"
fi

if [ ${stage} -le 6 ] && [ ${stop_stage} -ge 6 ]; then
    log "Stage 6: scoring trials of ${test_sets} -> ${spk_exp}/eval/<set>"
    not_implemented 6 "scoring"
fi

log "Successfully finished. [elapsed=${SECONDS}s]"
