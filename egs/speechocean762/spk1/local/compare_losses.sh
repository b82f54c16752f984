#!/usr/bin/env bash
# GE2E vs GE2E-XS vs AAM-softmax on the same data, model and schedule, over several seeds.
#
#   local/compare_losses.sh [--seeds "0 1"] [--configs "conf/tuning/train_ge2e.yaml ..."] [--suffix S]
#                           [--dev_sets "test dsp20 dsp20_8k"] [run.sh options]
#
# Needs stages 1-2 (./run.sh --stop_stage 2, or the demo itself).  For each config and seed it
# writes a copy of the config with train.seed set to the seed, trains and evaluates it with
# ./run.sh --stage 3 --batch_seed <seed> --tag <config>_seed<seed> (so the batch plan changes with
# the seed too), and finally prints a Markdown table of EER / minDCF per test set with the mean
# over seeds (exp/compare_losses.md; local/summarise_runs.py, which also plots runs against each
# other).  A run whose metrics already exist is not repeated; a trained run that lacks a test set
# (one added later) only gets stages 5-6 for the sets it lacks.
# --suffix S makes the tags <config>S_seed<seed>: one config run with other run.sh options (e.g.
# --num_spk 64 --num_utt 2) gets tags of its own.
# --dev_sets adds a column with the mean EER over those test sets (each of them must be among
# --test_sets): the development mean by which journal/ chooses the demo's settings.
set -euo pipefail

log() { echo "$(date '+%Y-%m-%dT%H:%M:%S') (${0##*/}) $*"; }

seeds="0 1"
configs="conf/tuning/train_ge2e.yaml conf/tuning/train_ge2e_xs.yaml conf/tuning/train_aam.yaml"
test_sets="test dsp20"
suffix=""
dev_sets=""
run_opts=()
while [ $# -gt 0 ]; do
    case "$1" in
        --seeds) seeds=$2; shift 2 ;;
        --configs) configs=$2; shift 2 ;;
        --test_sets) test_sets=$2; run_opts+=("$1" "$2"); shift 2 ;;
        --suffix) suffix=$2; shift 2 ;;
        --dev_sets) dev_sets=$2; shift 2 ;;
        *) run_opts+=("$1"); shift ;;
    esac
done

for s in ${dev_sets}; do
    if [[ " ${test_sets} " != *" ${s} "* ]]; then
        log "Error: --dev_sets holds ${s}, which is not among --test_sets (${test_sets})"
        exit 1
    fi
done
. ./path.sh
confdir=exp/compare_losses/conf
mkdir -p "${confdir}"
tags=()
for config in ${configs}; do
    name=$(basename "${config}" .yaml)${suffix}
    if ! grep -q '^  seed: ' "${config}"; then
        log "Error: ${config} has no '  seed:' line under train:"
        exit 1
    fi
    for seed in ${seeds}; do
        tag=${name}_seed${seed}
        tags+=("${tag}")
        missing=""
        for s in ${test_sets}; do
            [ -s "exp/spk_${tag}/eval/${s}/metrics.json" ] || missing+="${missing:+ }${s}"
        done
        if [ -z "${missing}" ]; then
            log "${tag}: metrics exist, skipped"
            continue
        fi
        if [ -s "exp/spk_${tag}/model.pth" ] && [ -s "exp/spk_${tag}/wall_seconds" ]; then
            # trained before a test set was added: embed and score the new sets only
            log "${tag}: trained; scoring ${missing} (log: exp/compare_losses/${tag}.score.log)"
            ./run.sh --stage 5 --stop_stage 6 --train_config "${confdir}/${tag}.yaml" --tag "${tag}" \
                "${run_opts[@]}" --test_sets "${missing}" > "exp/compare_losses/${tag}.score.log" 2>&1 \
                || { log "Error: scoring ${tag} failed, see exp/compare_losses/${tag}.score.log"; exit 1; }
            continue
        fi
        sed "s/^  seed: .*/  seed: ${seed}/" "${config}" > "${confdir}/${tag}.yaml"
        log "${tag}: training and evaluation (log: exp/compare_losses/${tag}.log)"
        start=$(date +%s)
        ./run.sh --stage 3 --train_config "${confdir}/${tag}.yaml" --tag "${tag}" --batch_seed "${seed}" \
            "${run_opts[@]}" > "exp/compare_losses/${tag}.log" 2>&1 \
            || { log "Error: ${tag} failed, see exp/compare_losses/${tag}.log"; exit 1; }
        echo $(( $(date +%s) - start )) > "exp/spk_${tag}/wall_seconds"
        log "${tag}: done in $(cat "exp/spk_${tag}/wall_seconds") s"
    done
done

runs=()
for tag in "${tags[@]}"; do
    runs+=("exp/spk_${tag}")
done
python "$(dirname "$0")/summarise_runs.py" --sets "${test_sets}" --dev_sets "${dev_sets}" "${runs[@]}" \
    | tee exp/compare_losses.md
