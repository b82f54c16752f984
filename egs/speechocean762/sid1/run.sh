#!/usr/bin/env bash
# speechocean762 speaker identification: the spk1 demo's data and model, then enrolment,
# closed-set (125-way speechocean762 test, 33-way DSPSpeech-20) and open-set identification.
#   ./run.sh                                            # trains the spk1 demo model here (stages 2-4)
#   ./run.sh --spk_model_dir ../spk1/exp/spk_train      # or reuses a trained spk1 model
set -euo pipefail
if [ ! -e ./sid.sh ]; then  # relative links and paths: the recipe runs from its own folder
    echo "$0: run it from its folder: cd $(dirname "$0") && ./run.sh" >&2
    exit 1
fi
. utils/supervise.sh  # a signal to this pid stops everything the run starts (spkflow.core.procs)

test_sets="test dsp20"
train_config=conf/train.yaml
# the spk1 demo's batches and epochs (used only when the model is trained here)
spk_opts="--num_spk 64 --num_utt 2 --num_epochs 84"
num_enrol=2          # speechocean762 test has 4 utterances per speaker: 2 enrol, 2 test
open_folds=5         # each fold holds out 25 of 125 (speechocean762) / 6-7 of 33 (DSPSpeech-20) speakers

./sid.sh \
    --test_sets "${test_sets}" \
    --train_config "${train_config}" \
    --spk_opts "${spk_opts}" \
    --num_enrol "${num_enrol}" \
    --open_folds "${open_folds}" \
    --nj 2 \
    "$@"
