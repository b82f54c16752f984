#!/usr/bin/env bash
# ESPnet TTS on spkflow x-vectors: the speaker-embedding stage of ESPnet's egs2/TEMPLATE/tts1/tts.sh
# (stage 3, "--use_spk_embed true") replaced by scripts/spk/extract_embeddings.sh, which writes the
# same layout and names (dump/xvector/<set>/xvector.scp per utterance, spk_xvector.scp per speaker;
# tts.sh's --spk_embed_tag xvector). Everything else is ESPnet's own code, run as tts.sh runs it:
#
#   1 data (local/data.sh: speechocean762 subsets with their text)
#   2 x-vectors with a spkflow model (--spk_model_dir) -> dump/xvector/{tr,dv,ev}/
#   3 char token list (espnet2.bin.tokenize_text) from data/tr/text
#   4 feature statistics: espnet2.bin.tts_train --collect_stats true (global_mvn needs them)
#   5 training: espnet2.bin.tts_train with spembs = our per-utterance x-vectors
#   6 inference: espnet2.bin.tts_inference on data/ev with spembs = our per-speaker x-vectors
#
#   ./run.sh --spk_model_dir ../spk1/exp/spk_train
set -euo pipefail
if [ ! -e ./path.sh ]; then  # relative links and paths: the recipe runs from its own folder
    echo "$0: run it from its folder: cd $(dirname "$0") && ./run.sh" >&2
    exit 1
fi
. utils/supervise.sh  # a signal to this pid stops everything the run starts (spkflow.core.procs)

log() {
    local fname=${BASH_SOURCE[1]##*/}
    echo -e "$(date '+%Y-%m-%dT%H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*"
}
SECONDS=0

stage=1               # first stage to run
stop_stage=10000      # last stage to run
nj=2                  # x-vector extraction jobs
spk_model_dir=../spk1/exp/spk_train   # spkflow stage-4 model dir (config.yaml + model.pth)
dumpdir=dump          # x-vectors go to ${dumpdir}/xvector/<set> (tts.sh: ${dumpdir}/${spk_embed_tag}/<set>)
expdir=exp
train_set="tr"        # data dirs written by local/data.sh
valid_set=dv
test_set=ev
local_data_opts=      # options for local/data.sh (--num-spk, --train-utts, --eval-spk)
train_config=conf/train.yaml
decode_config=conf/decode.yaml
vocoder_config=conf/vocoder.yaml
train_args=           # more options for espnet2.bin.tts_train, e.g. "--max_epoch 1"
tag=tiny_tacotron2    # experiment: ${expdir}/tts_${tag}

help_message="Usage: $0 [--stage N] [--stop_stage N] [--spk_model_dir DIR] [--local_data_opts OPTS] [--train_args ARGS] [--nj N]"

log "$0 $*"
. utils/parse_options.sh
if [ $# -ne 0 ]; then
    log "${help_message}"
    exit 2
fi

. ./path.sh
. ./cmd.sh

xvec=${dumpdir}/xvector         # tts.sh: ${dumpdir}/${spk_embed_tag} with --spk_embed_tag xvector
token_list=data/token_list/char/tokens.txt
stats_dir=${expdir}/tts_stats_${tag}
tts_exp=${expdir}/tts_${tag}

if [ ${stage} -le 1 ] && [ ${stop_stage} -ge 1 ]; then
    log "Stage 1: data preparation -> data/{${train_set},${valid_set},${test_set}}"
    # shellcheck disable=SC2086
    local/data.sh ${local_data_opts}
fi

if [ ${stage} -le 2 ] && [ ${stop_stage} -ge 2 ]; then
    log "Stage 2: x-vectors with ${spk_model_dir} -> ${xvec}/<set>/{xvector.scp,spk_xvector.scp}"
    for _f in config.yaml model.pth; do
        [ -f "${spk_model_dir}/${_f}" ] || { log "Error: --spk_model_dir ${spk_model_dir}: ${_f} not found (a spkflow stage-4 model dir)"; exit 1; }
    done
    for dset in "${train_set}" "${valid_set}" "${test_set}"; do
        scripts/spk/extract_embeddings.sh --cmd "${decode_cmd}" --nj "${nj}" --toolkit spkflow \
            --model-dir "${spk_model_dir}" "data/${dset}" "${xvec}/${dset}"
    done
fi

if [ ${stage} -le 3 ] && [ ${stop_stage} -ge 3 ]; then
    log "Stage 3: char token list from data/${train_set}/text -> ${token_list}"
    mkdir -p "$(dirname "${token_list}")"
    python -m espnet2.bin.tokenize_text --token_type char -f 2- \
        --input "data/${train_set}/text" --output "${token_list}" \
        --cleaner none --g2p none --write_vocabulary true \
        --add_symbol "<blank>:0" --add_symbol "<unk>:1" --add_symbol "<sos/eos>:-1"
    log "$(wc -l < "${token_list}") tokens"
fi

# ESPnet's data options, as tts.sh builds them: text, audio, and our x-vectors as spembs.
spk_dim() { python -c "import kaldiio, sys; print(next(iter(kaldiio.load_scp(sys.argv[1]).values())).shape[-1])" "$1"; }
data_opts=(
    --train_data_path_and_name_and_type "data/${train_set}/text,text,text"
    --train_data_path_and_name_and_type "data/${train_set}/wav.scp,speech,sound"
    --train_data_path_and_name_and_type "${xvec}/${train_set}/xvector.scp,spembs,kaldi_ark"
    --valid_data_path_and_name_and_type "data/${valid_set}/text,text,text"
    --valid_data_path_and_name_and_type "data/${valid_set}/wav.scp,speech,sound"
    --valid_data_path_and_name_and_type "${xvec}/${valid_set}/xvector.scp,spembs,kaldi_ark"
)
common_opts=(--config "${train_config}" --use_preprocessor true --token_type char --token_list "${token_list}"
             --cleaner none --g2p none --ngpu 0 --use_tensorboard false)

if [ ${stage} -le 4 ] && [ ${stop_stage} -ge 4 ]; then
    log "Stage 4: feature statistics (tts_train --collect_stats true) -> ${stats_dir}"
    _dim=$(spk_dim "${xvec}/${train_set}/xvector.scp")
    mkdir -p "${stats_dir}"
    # shellcheck disable=SC2086
    python -m espnet2.bin.tts_train --collect_stats true --normalize none "${common_opts[@]}" \
        --tts_conf spk_embed_dim="${_dim}" "${data_opts[@]}" \
        --train_shape_file "data/${train_set}/wav.scp" --valid_shape_file "data/${valid_set}/wav.scp" \
        --output_dir "${stats_dir}" ${train_args} > "${stats_dir}/stats.log" 2>&1 || {
        log "Error: collect_stats failed, see ${stats_dir}/stats.log:"; tail -n 20 "${stats_dir}/stats.log" >&2; exit 1; }
    # as tts.sh: text shapes with the vocabulary size appended, named after the token type
    for _s in train valid; do
        awk -v n="$(wc -l < "${token_list}")" '{ print $0 "," n }' "${stats_dir}/${_s}/text_shape" \
            > "${stats_dir}/${_s}/text_shape.char"
    done
fi

if [ ${stage} -le 5 ] && [ ${stop_stage} -ge 5 ]; then
    _dim=$(spk_dim "${xvec}/${train_set}/xvector.scp")
    log "Stage 5: training (tts_train, spembs = ${_dim}-d x-vectors of ${xvec}/${train_set}/xvector.scp) -> ${tts_exp}"
    mkdir -p "${tts_exp}"
    # shellcheck disable=SC2086
    python -m espnet2.bin.tts_train "${common_opts[@]}" --tts_conf spk_embed_dim="${_dim}" "${data_opts[@]}" \
        --normalize_conf stats_file="${stats_dir}/train/feats_stats.npz" \
        --train_shape_file "${stats_dir}/train/text_shape.char" --train_shape_file "${stats_dir}/train/speech_shape" \
        --valid_shape_file "${stats_dir}/valid/text_shape.char" --valid_shape_file "${stats_dir}/valid/speech_shape" \
        --resume true --output_dir "${tts_exp}" ${train_args} > "${tts_exp}/train.log" 2>&1 || {
        log "Error: training failed, see ${tts_exp}/train.log:"; tail -n 20 "${tts_exp}/train.log" >&2; exit 1; }
    grep -E "epoch results" "${tts_exp}/train.log" | sed 's/^.*INFO: //' | while read -r _line; do log "${_line}"; done
fi

if [ ${stage} -le 6 ] && [ ${stop_stage} -ge 6 ]; then
    _dir=${tts_exp}/decode_${test_set}
    log "Stage 6: inference on data/${test_set} with per-speaker x-vectors -> ${_dir}/wav"
    # ESPnet's inference reads spembs per utterance key: point each utterance at its speaker's mean
    # x-vector (spk_xvector.scp) through utt2spk, so every sentence of a speaker gets the same voice.
    _spk_scp=${xvec}/${test_set}/spk_xvector_by_utt.scp
    awk 'NR == FNR { x[$1] = $2; next }
         !($2 in x) { print "no x-vector for speaker " $2 " (utterance " $1 ")" > "/dev/stderr"; exit 1 }
         { print $1, x[$2] }' "${xvec}/${test_set}/spk_xvector.scp" "data/${test_set}/utt2spk" > "${_spk_scp}"
    _model=${tts_exp}/valid.loss.best.pth
    [ -e "${_model}" ] || _model=${tts_exp}/latest.pth
    mkdir -p "${_dir}"
    python -m espnet2.bin.tts_inference --config "${decode_config}" --ngpu 0 \
        --data_path_and_name_and_type "data/${test_set}/text,text,text" \
        --data_path_and_name_and_type "${_spk_scp},spembs,kaldi_ark" \
        --train_config "${tts_exp}/config.yaml" --model_file "${_model}" \
        --vocoder_config "${vocoder_config}" --output_dir "${_dir}" > "${_dir}/inference.log" 2>&1 || {
        log "Error: inference failed, see ${_dir}/inference.log:"; tail -n 20 "${_dir}/inference.log" >&2; exit 1; }
    log "$(find "${_dir}/wav" -name '*.wav' | wc -l) waveforms in ${_dir}/wav, mel features in ${_dir}/norm/feats.scp"
fi

log "Successfully finished. [elapsed=${SECONDS}s]"
