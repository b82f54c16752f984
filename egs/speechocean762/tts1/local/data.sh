#!/usr/bin/env bash
# Data of the tiny TTS demo, from speechocean762 (text = the prompt each speaker read):
#   data/tr  the first <num_spk> speakers of the official train split, <train_utts> utterances each
#   data/dv  the next utterance of each of those speakers (validation)
#   data/ev  the first <eval_spk> speakers of the official test split (unseen), all their utterances:
#            their texts are synthesised with the speaker's mean x-vector
# Speakers and utterances are taken in LC_ALL=C order (no randomness).
set -euo pipefail

log() {
    local fname=${BASH_SOURCE[1]##*/}
    echo -e "$(date '+%Y-%m-%dT%H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*"
}

num_spk=8           # training speakers
train_utts=4        # training utterances per speaker (one more goes to data/dv)
eval_spk=2          # unseen speakers to synthesise
download=true       # try to download speechocean762 when it is missing

help_message="Usage: $0 [--num-spk 8] [--train-utts 4] [--eval-spk 2] [--download true]"

. utils/parse_options.sh
if [ $# -ne 0 ]; then
    printf '%b\n' "${help_message}" >&2
    exit 1
fi

. ./path.sh
. ./db.sh

for v in num_spk train_utts eval_spk; do
    if ! [[ "${!v}" =~ ^[0-9]+$ ]] || [ "${!v}" -lt 1 ]; then
        log "Error: --${v//_/-} must be a positive integer, got '${!v}'"
        exit 1
    fi
done

log "speechocean762 from SPEECHOCEAN762=${SPEECHOCEAN762}"
for split in train test; do
    python -m spkflow.bin.prepare_corpus speechocean762 --download "${download}" --utt2dur false --split "${split}" \
        "${SPEECHOCEAN762}" "data/${split}_all"
done

mkdir -p data/lists
head -n "${num_spk}" data/train_all/spk2utt | awk -v n="${train_utts}" \
    '{ if (NF < n + 2) { print "speaker " $1 " has " NF - 1 " utterances, needs " n + 1 > "/dev/stderr"; exit 1 }
       for (i = 2; i <= n + 1; i++) print $i > "data/lists/tr"; print $(n + 2) > "data/lists/dv" }'
head -n "${eval_spk}" data/test_all/spk2utt | cut -d' ' -f1 > data/lists/ev_spk
utils/subset_data_dir.sh --utt-list data/lists/tr data/train_all data/tr
utils/subset_data_dir.sh --utt-list data/lists/dv data/train_all data/dv
utils/subset_data_dir.sh --spk-list data/lists/ev_spk data/test_all data/ev
for dset in tr dv ev; do
    utils/validate_data_dir.sh --no-feats "data/${dset}"
    log "data/${dset}: $(wc -l < "data/${dset}/spk2utt") speakers, $(wc -l < "data/${dset}/utt2spk") utterances"
done
