#!/usr/bin/env bash
# Make a new spk1 recipe folder whose links work, as ESPnet's egs2/TEMPLATE/asr1/setup.sh does.
#
#   egs/TEMPLATE/spk1/setup.sh egs/mycorpus/spk1
#   cd egs/mycorpus/spk1 && ./run.sh --help
#
# Links (relative, computed from where NEW_DIR really is, so it may live at any depth, even
# outside egs/): spk.sh, path.sh, db.sh -> this folder; sid.sh -> ../sid1/sid.sh; diar.sh ->
# ../diar1/diar.sh; scripts/, utils/ -> the project's.  Copies, yours to edit: cmd.sh (the job back end), conf/ (fbank, VAD,
# scheduler and training configs; conf/train.yaml -> train_ecapa_ge2e_xs.yaml), and two starting
# points: local/data.sh (a folder of recordings, one subfolder per speaker, -> data/<set> with
# trials, by python -m spkflow.bin.make_data_dir; or one folder split by speaker) and run.sh (the options; ./spk.sh does the stages).
# Nothing existing is overwritten: a NEW_DIR that already holds run.sh is refused.
set -euo pipefail

log() {
    local fname=${BASH_SOURCE[1]##*/}
    echo -e "$(date '+%Y-%m-%dT%H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*"
}

help_message="Usage: $0 <new-recipe-dir>   (e.g. $0 egs/mycorpus/spk1)"
if [ $# -ne 1 ] || [ "$1" = --help ] || [ "$1" = -h ]; then
    echo "${help_message}" >&2
    [ $# -eq 1 ] && exit 0
    exit 2
fi
dir=$1
template=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")" && pwd -P)
root=$(cd "${template}/../../.." && pwd -P)

if [ -e "${dir}/run.sh" ]; then
    log "Error: ${dir}/run.sh exists: ${dir} is a recipe already (nothing changed)"
    exit 1
fi
mkdir -p "${dir}/local"
real=$(cd "${dir}" && pwd -P)

link() {  # link NAME TARGET: NAME in the new recipe -> TARGET, relative to the recipe's real folder
    ln -sfn "$(realpath --relative-to="${real}" "$2")" "${real}/$1"
}
for f in spk.sh path.sh db.sh; do
    link "${f}" "${template}/${f}"
done
link sid.sh "${template}/../sid1/sid.sh"
link diar.sh "${template}/../diar1/diar.sh"
link scripts "${root}/scripts"
link utils "${root}/utils"
[ -e "${real}/cmd.sh" ] || cp "${template}/cmd.sh" "${real}/cmd.sh"
if [ ! -e "${real}/conf" ]; then
    cp -r "${template}/conf" "${real}/conf"
    ln -sfn train_ecapa_ge2e_xs.yaml "${real}/conf/train.yaml"
fi

if [ ! -e "${real}/local/data.sh" ]; then
    cat > "${real}/local/data.sh" <<'EOF'
#!/usr/bin/env bash
# Data preparation (stage 1 of spk.sh): folders of recordings, one subfolder per speaker, ->
# data/<set> (wav.scp, utt2spk, spk2utt, utt2dur and, for the test sets, trials), checked.
#   ./run.sh --stage 1 --stop_stage 1 --local_data_opts "--train_dir /data/train_audio --test_dir /data/test_audio"
#   ./run.sh --stage 1 --stop_stage 1 --local_data_opts "--audio_dir /data/all_audio"   # split by speaker
# Edit freely: any script that writes valid data dirs will do (docs/corpora.md).
set -euo pipefail

log() {
    local fname=${BASH_SOURCE[1]##*/}
    echo -e "$(date '+%Y-%m-%dT%H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*"
}

train_dir=           # folder of the training recordings (empty: no training set, e.g. with --pretrained)
train_set=train      # its data dir: data/<train_set>
test_dir=            # folder of the test recordings (required, unless audio_dir)
test_set="test"      # its data dir: data/<test_set>, with trials (at most 500 target pairs per speaker + 10
                     # others per target)
audio_dir=           # instead of train_dir and test_dir: one folder, split by speaker into both sets
test_speakers=0.2    # with audio_dir: the share (or the number) of its speakers held out for data/<test_set>
split_seed=0         # with audio_dir: the seed of that choice
speaker_regex=       # speaker = this regex's group 'spk' in the path below the folder (empty: first subfolder)

help_message="Usage: $0 [--train_dir DIR] --test_dir DIR | --audio_dir DIR [--test_speakers 0.2] [--split_seed 0]
         [--train_set NAME] [--test_set NAME] [--speaker_regex REGEX]"
. utils/parse_options.sh
if [ $# -ne 0 ] || [ -z "${test_dir}${audio_dir}" ] || { [ -n "${audio_dir}" ] && [ -n "${train_dir}${test_dir}" ]; }; then
    echo "${help_message}" >&2
    exit 1
fi
. ./path.sh

opts=()
[ -n "${speaker_regex}" ] && opts+=(--speaker-regex "${speaker_regex}")
if [ -n "${audio_dir}" ]; then
    python -m spkflow.bin.make_data_dir "${opts[@]}" --split "data/${test_set}" --test-speakers "${test_speakers}" \
        --split-seed "${split_seed}" "${audio_dir}" "data/${train_set}"
    train_dir=${audio_dir}
else
    if [ -n "${train_dir}" ]; then
        python -m spkflow.bin.make_data_dir "${opts[@]}" "${train_dir}" "data/${train_set}"
    fi
    python -m spkflow.bin.make_data_dir "${opts[@]}" --trials true "${test_dir}" "data/${test_set}"
fi
log "Successfully finished: data/{${train_dir:+${train_set},}${test_set}}"
EOF
    chmod +x "${real}/local/data.sh"
fi

cat > "${real}/run.sh" <<'EOF'
#!/usr/bin/env bash
# A speaker-embedder recipe made by egs/TEMPLATE/spk1/setup.sh: the options live here, ./spk.sh
# runs the stages (./run.sh --help lists every option with its default).
#   ./run.sh --local_data_opts "--train_dir /data/train_audio --test_dir /data/test_audio"
#   ./run.sh --pretrained /path/to/spk_train.zip --stage 1 --local_data_opts "--test_dir /data/mine"
set -euo pipefail
if [ ! -e ./spk.sh ]; then  # relative links and paths: the recipe runs from its own folder
    echo "$0: run it from its folder: cd $(dirname "$0") && ./run.sh" >&2
    exit 1
fi
. utils/supervise.sh  # a signal to this pid stops everything the run starts (spkflow.core.procs)

train_set=train
test_sets="test"
train_config=conf/train.yaml

./spk.sh \
    --train_set "${train_set}" \
    --test_sets "${test_sets}" \
    --train_config "${train_config}" \
    "$@"
EOF
chmod +x "${real}/run.sh"
log "Created ${dir}: run.sh, local/data.sh, cmd.sh, conf/ (yours to edit); spk.sh, sid.sh, path.sh, db.sh," \
    "scripts, utils (links). Next: cd ${dir} && ./run.sh --help"
