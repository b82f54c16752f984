#!/usr/bin/env bash
# Staged driver for speaker-identification (SID) recipes on top of spk1's stages.
# Stages 1-5 are spk.sh's (data, fbank + VAD, batches, training, extraction); stages 6-8 are SID's.
#
#   ./run.sh                                                  # train a model here, then SID
#   ./run.sh --spk_model_dir ../spk1/exp/spk_train            # reuse a spk1 model: stages 2-4 skipped
#   ./run.sh --spk_model_dir spk_train.zip                    # or a packed one
#   ./run.sh --spk_model_dir spkrec-ecapa-voxceleb            # or another toolkit's model (told from its files)
#   ./run.sh --stage 6 --num_enrol 3 --backend lda            # SID stages again on the same embeddings
#
# Stages: 1 data prep, 2 fbank + VAD, 3 batch lists, 4 training (all four: spk.sh),
#         5 embedding extraction (spk.sh, or scripts/spk/extract_embeddings.sh with --spk_model_dir),
#         6 enrolment (seeded enrolment/test split, backend, speaker models),
#         7 closed-set identification (top-1/top-5, confusion plot),
#         8 open-set identification (DIR at FAR) and RESULTS.md.
# Outputs: ${expdir}/<model tag>/sid/<set>/{enrol,test,folds,spk_model.scp,predictions,metrics.json,confusion.png}
set -euo pipefail

# A recipe folder holds path.sh, cmd.sh, spk.sh, utils/ and scripts/.
for _f in path.sh cmd.sh spk.sh utils/parse_options.sh utils/supervise.sh scripts/lib/help.sh; do
    if [ ! -e "${_f}" ]; then
        echo "${0##*/}: no ${_f} in $(pwd): run it from a recipe folder, e.g. cd egs/speechocean762/sid1 && ./run.sh" >&2
        exit 1
    fi
done
. utils/supervise.sh  # a signal to this pid stops everything the run starts (spkflow.core.procs)

log() {
    local fname=${BASH_SOURCE[1]##*/}
    echo -e "$(date '+%Y-%m-%dT%H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*"
}
SECONDS=0

# General options.
stage=1               # first stage to run
stop_stage=10000      # last stage to run
nj=                   # parallel jobs for features and extraction (default: the CPU cores, at most 4)
expdir=exp            # where experiments go

# Model options (stages 1-5, passed to spk.sh).
spk_model_dir=        # a stage-4 model dir (config.yaml + model.pth) or its packed .zip to reuse; empty: train
                      # one here (stages 2-4); or another toolkit's pretrained model (spk_toolkit)
spk_toolkit=          # the toolkit of --spk_model_dir as extract_embeddings.sh --toolkit takes it (empty: from its files)
train_set=train       # training data dir under data/ (only when training here)
test_sets="test"      # data dirs under data/ to identify speakers in
train_config=conf/train.yaml  # training config (only when training here)
tag=                  # model tag: exp/spk_<tag> (default: from train_config, or spk_model_dir's name)
spk_opts=             # more options for spk.sh, e.g. "--num_spk 32 --num_utt 4 --num_epochs 4"
embed_opts=           # more options for scripts/spk/extract_embeddings.sh (with --spk_model_dir)

# SID options (stages 6-8).
num_enrol=2           # K: enrolment utterances per speaker (speaker model = mean of their embeddings)
split_seed=0          # seed of the enrolment/test split and of the open-set folds
open_folds=5          # open set: fold f never enrols 1/open_folds of the speakers (the impostors)
backend=cosine        # cosine | wccn | lda (WCCN or LDA fitted on the enrolment embeddings, then cosine)
lda_dim=0             # LDA dimension (0: min(embedding dim, speakers - 1))
far=0.01              # false-alarm rate the open-set threshold is set for

# shellcheck disable=SC1091  # scripts/ is the recipe's link to the project's scripts
help_message=$(. scripts/lib/help.sh; options_help "${BASH_SOURCE[0]}" \
    "Usage: $0 [options]   (stages 1 data, 2 fbank, 3 batches, 4 train, 5 embed, 6 enrol, 7 closed set, 8 open set)")

log "$0 $*"
. utils/parse_options.sh

if [ $# -ne 0 ]; then
    log "${help_message}"
    log "Error: unknown arguments: $*"
    exit 2
fi

. ./path.sh
. ./cmd.sh

case "${backend}" in cosine|wccn|lda) ;; *) log "Error: --backend must be cosine, wccn or lda, got '${backend}'"; exit 2 ;; esac
if [ -z "${nj}" ]; then
    nj=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2> /dev/null || echo 4)  # path.sh sets OMP_NUM_THREADS=1
    [ "${nj}" -gt 4 ] && nj=4
fi
if [ -n "${spk_model_dir}" ]; then
    # what the model is (spkflow.bin.model_info: its toolkit, where its files are; a pack is verified
    # and unpacked once into the cache); what stage 5 cannot run is refused here
    _info=$(python -m spkflow.bin.model_info --jobs true ${spk_toolkit:+--toolkit "${spk_toolkit}"} "${spk_model_dir}") || exit 1
    model_toolkit=; model_name=  # set by:
    eval "${_info}"  # model_toolkit, model_dir, model_name, ...
    [ -z "${tag}" ] && tag=${model_name}
    sid_exp=${expdir}/${tag}
elif [ -n "${spk_toolkit}" ]; then
    log "Error: --spk_toolkit ${spk_toolkit} needs --spk_model_dir (the pretrained model)"
    exit 2
else
    [ -z "${tag}" ] && tag=$(basename "${train_config}" .yaml)
    model_dir=${expdir}/spk_${tag}
    sid_exp=${model_dir}
fi

# spk.sh runs stages 1-5 with the same data and model options.
# shellcheck disable=SC2206
spk_args=(--nj "${nj}" --expdir "${expdir}" --train_set "${train_set}" --test_sets "${test_sets}"
          --train_config "${train_config}" --tag "${tag}" ${spk_opts})

if [ ${stage} -le 1 ] && [ ${stop_stage} -ge 1 ]; then
    log "Stage 1: data preparation (spk.sh stage 1)"
    ./spk.sh --stage 1 --stop_stage 1 "${spk_args[@]}"
fi

if [ -z "${spk_model_dir}" ] && [ ${stage} -le 4 ] && [ ${stop_stage} -ge 2 ]; then
    _first=$(( stage > 2 ? stage : 2 )); _last=$(( stop_stage < 4 ? stop_stage : 4 ))
    log "Stages ${_first}-${_last}: features, batches, training (spk.sh) -> ${model_dir}"
    ./spk.sh --stage "${_first}" --stop_stage "${_last}" "${spk_args[@]}"
elif [ -n "${spk_model_dir}" ] && [ ${stage} -le 4 ] && [ ${stop_stage} -ge 2 ]; then
    log "Stages 2-4 skipped: reusing the model in ${spk_model_dir}"
fi

if [ ${stage} -le 5 ] && [ ${stop_stage} -ge 5 ]; then
    if [ -z "${spk_model_dir}" ]; then
        log "Stage 5: embeddings of ${test_sets} (spk.sh stage 5) -> ${sid_exp}/embed/<set>"
        ./spk.sh --stage 5 --stop_stage 5 --embed_sets "${test_sets}" --calibrate false "${spk_args[@]}"
    else
        log "Stage 5: embeddings of ${test_sets} with the ${model_toolkit} model ${spk_model_dir} -> ${sid_exp}/embed/<set>"
        mkdir -p "${sid_exp}"
        echo "${spk_model_dir}" > "${sid_exp}/model_dir"
        for dset in ${test_sets}; do
            # shellcheck disable=SC2086
            scripts/spk/extract_embeddings.sh --cmd "${decode_cmd}" --nj "${nj}" ${spk_toolkit:+--toolkit "${spk_toolkit}"} \
                ${embed_opts} --model-dir "${spk_model_dir}" "data/${dset}" "${sid_exp}/embed/${dset}"
        done
    fi
fi

if [ ${stage} -le 6 ] && [ ${stop_stage} -ge 6 ]; then
    log "Stage 6: enrolment, K=${num_enrol} utterances per speaker (seed ${split_seed}), ${backend} backend"
    # spkflow/score/sid.py: each speaker's utterances are shuffled by a generator seeded from (seed, speaker);
    # the first K enrol, the rest are test utterances; speakers with < K+1 utterances are left out
    # (named on the console and listed in <set>/dropped_spks).
    for dset in ${test_sets}; do
        _sid=${sid_exp}/sid/${dset}
        [ -f "${sid_exp}/embed/${dset}/xvector.scp" ] || { log "Error: ${sid_exp}/embed/${dset}/xvector.scp not found (run stage 5)"; exit 1; }
        # a new split invalidates every figure of the old one: each `spkflow.bin.sid` stage first
        # removes what it and the stages after it wrote (and sid/RESULTS.md), so after a failure
        # nothing of an earlier run looks current
        python -m spkflow.bin.sid split --spk2utt "data/${dset}/spk2utt" --num-enrol "${num_enrol}" \
            --seed "${split_seed}" --folds "${open_folds}" --outdir "${_sid}"
        python -m spkflow.bin.sid enrol --xvector-scp "${sid_exp}/embed/${dset}/xvector.scp" \
            --sid-dir "${_sid}" --backend "${backend}" --lda-dim "${lda_dim}"
    done
fi

if [ ${stage} -le 7 ] && [ ${stop_stage} -ge 7 ]; then
    log "Stage 7: closed-set identification -> ${sid_exp}/sid/<set>/{predictions,confusion.png,metrics.json}"
    for dset in ${test_sets}; do
        python -m spkflow.bin.sid closed --xvector-scp "${sid_exp}/embed/${dset}/xvector.scp" --sid-dir "${sid_exp}/sid/${dset}"
    done
fi

if [ ${stage} -le 8 ] && [ ${stop_stage} -ge 8 ]; then
    log "Stage 8: open-set identification (${open_folds} folds, FAR ${far}) -> ${sid_exp}/sid/<set>/metrics.json"
    for dset in ${test_sets}; do
        python -m spkflow.bin.sid open --xvector-scp "${sid_exp}/embed/${dset}/xvector.scp" \
            --sid-dir "${sid_exp}/sid/${dset}" --backend "${backend}" --lda-dim "${lda_dim}" --far "${far}"
    done
    python -m spkflow.bin.sid results --sid-root "${sid_exp}/sid" --title "${tag}"
    log "Results: ${sid_exp}/sid/RESULTS.md"
fi

log "Successfully finished. [elapsed=${SECONDS}s]"
