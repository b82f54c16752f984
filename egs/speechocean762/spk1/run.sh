#!/usr/bin/env bash
# speechocean762 speaker-embedder demo: train on the 125 speakers of the official train
# split, evaluate on the 125 disjoint test speakers and, across corpora, on DSPSpeech-20.
set -euo pipefail

train_set=train
test_sets="test dsp20"
train_config=conf/train.yaml

./spk.sh \
    --train_set "${train_set}" \
    --test_sets "${test_sets}" \
    --train_config "${train_config}" \
    --nj 2 \
    "$@"
