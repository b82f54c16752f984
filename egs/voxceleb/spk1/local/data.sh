#!/usr/bin/env bash
# Data preparation of the VoxCeleb recipe (stage 1 of spk.sh calls it), from db.sh's corpora:
#   data/vox2_dev      VoxCeleb2 dev, m4a decoded by an ffmpeg pipe in wav.scp (training)
#   data/vox1          all of VoxCeleb1 (the test audio of every list)
#   data/vox1_{o,e,h}  one data dir per cleaned list (veri_test2.txt, list_test_all2.txt,
#                      list_test_hard2.txt): the utterances it names + its trials, converted
#   data/musan_{noise,music,speech}, data/rirs   augmentation sources (wav.scp)
# and with --vox12 true also data/vox1_dev and data/vox12 (= vox2_dev + vox1_dev; Vox1-E/H
# use VoxCeleb1 dev speakers, so a vox12 model is scored on Vox1-O only).
# Every data dir is written by python -m spkflow.bin.prepare_corpus (docs/corpora.md).
set -euo pipefail

log() {
    local fname=${BASH_SOURCE[1]##*/}
    echo -e "$(date '+%Y-%m-%dT%H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*"
}

vox12=false          # also prepare data/vox1_dev and data/vox12 (train with --train_set vox12)
trial_sets="vox1_o vox1_e vox1_h"   # which official lists to convert (files in VOXCELEB1)
missing=error        # a list line naming a file not in VOXCELEB1: error | skip (skipped trials are counted)
augment=true         # prepare the MUSAN and RIRS_NOISES data dirs
ffmpeg=              # ffmpeg for the m4a pipes (default: the imageio-ffmpeg binary of the venv)

help_message="Usage: $0 [--vox12 false] [--trial-sets \"vox1_o vox1_e vox1_h\"] [--missing error|skip] [--augment true] [--ffmpeg PATH]"

. utils/parse_options.sh
if [ $# -ne 0 ]; then
    printf '%b\n' "${help_message}" >&2
    exit 1
fi
case "${missing}" in error|skip) ;; *) log "Error: --missing must be error or skip, got '${missing}'"; exit 1 ;; esac

. ./path.sh
. ./db.sh

prepare() { python -m spkflow.bin.prepare_corpus "$@"; }

log "VoxCeleb2 dev from VOXCELEB2=${VOXCELEB2}"
prepare voxceleb2 --part dev ${ffmpeg:+--ffmpeg "${ffmpeg}"} "${VOXCELEB2}" data/vox2_dev

log "VoxCeleb1 from VOXCELEB1=${VOXCELEB1}"
prepare voxceleb1 --part all "${VOXCELEB1}" data/vox1
for set in ${trial_sets}; do
    case "${set}" in
        vox1_o) list=veri_test2.txt ;;
        vox1_e) list=list_test_all2.txt ;;
        vox1_h) list=list_test_hard2.txt ;;
        *) log "Error: unknown trial set '${set}' (vox1_o | vox1_e | vox1_h)"; exit 1 ;;
    esac
    prepare voxceleb1 --trial-list "${list}" --missing "${missing}" "${VOXCELEB1}" "data/${set}"
done

if ${vox12}; then
    prepare voxceleb1 --part dev "${VOXCELEB1}" data/vox1_dev
    utils/combine_data.sh data/vox12 data/vox2_dev data/vox1_dev
    log "data/vox12 = vox2_dev + vox1_dev; Vox1-E/H share speakers with it: report Vox1-O only"
fi

if ${augment}; then
    log "augmentation sources from MUSAN=${MUSAN}, RIRS_NOISES=${RIRS_NOISES}"
    for part in noise music speech; do
        prepare musan --part "${part}" "${MUSAN}" "data/musan_${part}"
    done
    prepare rirs_noises "${RIRS_NOISES}" data/rirs
fi

log "Successfully finished: data/{vox2_dev,vox1,${trial_sets// /,}}"
