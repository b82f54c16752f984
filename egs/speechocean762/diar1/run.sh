#!/usr/bin/env bash
# speechocean762 diarization demo: the spk1 demo model (trained on speechocean762's 125 training
# speakers) diarizes conversations simulated from speakers it never saw, speechocean762's 125 test
# speakers (sim_so762) and the 8 LibriSpeech mini speakers (sim), with the turn-taking of AMI
# meetings, and the real AMI excerpts; oracle speech, 1.5 s windows every 0.75 s.
#   ./run.sh                                                 # ../spk1/exp/spk_train (train it first)
#   ./run.sh --spk_model ../spk1/exp/spk_train/packed/spk_train.zip
#   ./run.sh --speech silero                                 # the default detector instead of oracle speech (or energy)
set -euo pipefail
if [ ! -e ./diar.sh ]; then  # relative links and paths: the recipe runs from its own folder
    echo "$0: run it from its folder: cd $(dirname "$0") && ./run.sh" >&2
    exit 1
fi
. utils/supervise.sh  # a signal to this pid stops everything the run starts (spkflow.core.procs)

sets="sim_so762 sim ami"
spk_model=../spk1/exp/spk_train
speech=oracle
# The pipeline: the model's scoring (WCCN, AS-norm, calibration), average-linkage clustering stopped
# at the calibrated LLR 0 (count estimated, at most 8), resegmentation; the plain baseline (window
# embeddings + spectral clustering) beside it.  Chosen on the simulated and AMI sets (RESULTS.md).
cluster_method=ahc
max_speakers=8
# Beside it, the pipeline with a second speaker in the reference's overlapped speech: the gain an
# overlap detector could bring (none is built; AMI is a quarter overlap).
overlap=oracle

./diar.sh \
    --sets "${sets}" \
    --spk_model "${spk_model}" \
    --speech "${speech}" \
    --cluster_method "${cluster_method}" \
    --max_speakers "${max_speakers}" \
    --overlap "${overlap}" \
    --nj 2 \
    "$@"
