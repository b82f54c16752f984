#!/usr/bin/env bash
# Data preparation of the speechocean762 demo (stage 1 of spk.sh calls it):
#   data/train  speechocean762 official train split: 125 speakers x 12 utterances
#   data/test   speechocean762 official test split: 125 other speakers x 4, with trials
#   data/dsp20  DSPSpeech-20 (rounds 01-02): 33 speakers x 40, with trials (cross-corpus test)
#   data/dsp20_8k  data/dsp20 read through an 8 kHz channel (local/narrowband_copy.py: ffmpeg
#                  pipes), a development set in the telephone band (--dsp20_8k false: not made)
# and, on request (--librispeech true, --fsdd true), two more held-out test sets:
#   data/libri  LibriSpeech mini (English read speech), with trials
#   data/fsdd   Free Spoken Digit Dataset (English digits, 8 kHz), with trials
# Corpus locations come from db.sh (SPEECHOCEAN762, DSPSPEECH20, LIBRISPEECH, FSDD); each data dir is made by
# the one corpus front end, python -m spkflow.bin.prepare_corpus (docs/corpora.md), which also validates it.
set -euo pipefail

log() {
    local fname=${BASH_SOURCE[1]##*/}
    echo -e "$(date '+%Y-%m-%dT%H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*"
}

nontarget_ratio=10       # at most this many non-target trials per target trial
trials_seed=0            # seed of the non-target trial sample
dsp20_rounds="01 02"     # DSPSpeech-20 rounds to use (the shared copy has 01-02; the release 01-20)
download=true            # try to download a missing corpus (fails fast without network)
librispeech=false        # also prepare data/libri (LIBRISPEECH in db.sh)
fsdd=false               # also prepare data/fsdd (FSDD in db.sh)
dsp20_8k=true            # also prepare data/dsp20_8k (DSPSpeech-20 at 8 kHz)

help_message="Usage: $0 [--nontarget-ratio 10] [--trials-seed 0] [--dsp20-rounds \"01 02\"] [--download true] [--librispeech false] [--fsdd false] [--dsp20_8k true]"

. utils/parse_options.sh
if [ $# -ne 0 ]; then
    printf '%b\n' "${help_message}" >&2
    exit 1
fi

. ./path.sh
. ./db.sh

trial_opts=(--trials true --nontarget-ratio "${nontarget_ratio}" --trials-seed "${trials_seed}")
prepare() { python -m spkflow.bin.prepare_corpus "$@"; }

log "speechocean762 from SPEECHOCEAN762=${SPEECHOCEAN762}"
prepare speechocean762 --download "${download}" --split train "${SPEECHOCEAN762}" data/train
prepare speechocean762 --download "${download}" --split test "${trial_opts[@]}" "${SPEECHOCEAN762}" data/test

log "DSPSpeech-20 from DSPSPEECH20=${DSPSPEECH20}"
prepare dspspeech20 --download "${download}" --rounds "${dsp20_rounds}" "${trial_opts[@]}" "${DSPSPEECH20}" data/dsp20

sets="train test dsp20"
if ${dsp20_8k}; then
    log "DSPSpeech-20 through an 8 kHz channel"
    python local/narrowband_copy.py --rate 8000 data/dsp20 data/dsp20_8k
    sets+=" dsp20_8k"
fi
if ${librispeech}; then
    log "LibriSpeech from LIBRISPEECH=${LIBRISPEECH}"
    prepare librispeech "${trial_opts[@]}" "${LIBRISPEECH}" data/libri
    sets+=" libri"
fi
if ${fsdd}; then
    log "FSDD from FSDD=${FSDD}"
    prepare fsdd --download "${download}" "${trial_opts[@]}" "${FSDD}" data/fsdd
    sets+=" fsdd"
fi

log "Successfully finished: data/{${sets// /,}}"
