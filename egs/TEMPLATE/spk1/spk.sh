#!/usr/bin/env bash
# Staged driver for speaker-embedder recipes (ESPnet/Kaldi conventions).
# A recipe's run.sh passes options; every stage reads and writes files only.
#
#   ./run.sh --stage 2 --stop_stage 5 --nj 8
#
# Stages: 1 data prep, 2 fbank + VAD, 3 N x M batch lists, 4 training,
#         5 embedding extraction, 6 scoring (EER, minDCF, plots), 7 pack the model into one file.
set -euo pipefail

log() {
    local fname=${BASH_SOURCE[1]##*/}
    echo -e "$(date '+%Y-%m-%dT%H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*"
}
SECONDS=0

# General options.
stage=1               # first stage to run
stop_stage=10000      # last stage to run
nj=4                  # parallel jobs for feature and embedding extraction
ngpu=0                # GPUs for training: 0 = CPU, 1 = one GPU, >1 = torchrun DDP
nproc=1               # training processes when ngpu=0 (>1: CPU DDP with gloo through torchrun)
num_nodes=1           # training nodes: >1 = one Slurm job of num_nodes tasks (cmd_backend=slurm), ngpu/nproc per node
gpu_inference=false   # extract embeddings on GPU (one GPU per job)
expdir=exp            # where experiments go
dumpdir=dump          # where features go

# Data options.
train_set=train       # training data dir under data/
test_sets="test"      # evaluation data dirs under data/ (each with a trials file)
valid_set=            # data dir with trials used for validation EER during training (default: first test set)
local_data_opts=      # options passed to local/data.sh

# Feature options (stage 2).
fbank_conf=conf/fbank.conf   # Kaldi-style fbank options, one --opt=value per line
vad_conf=conf/vad.conf       # energy VAD options
skip_bad=false               # leave out unreadable utterances (listed in bad_utts) instead of failing
fbank_compress=false         # Kaldi-compress feature arks (two bytes per value: half the size, error ~3e-4)

# Batch options (stage 3).
num_spk=32            # N speakers per batch
num_utt=6             # M utterances per speaker
num_epochs=10         # epochs to plan and train
batch_seed=0          # seed of the batch plan
short_speakers=drop   # speakers with fewer than num_utt utterances: drop | repeat

# Training options (stage 4).
train_config=conf/train.yaml  # model, loss, optimiser, loader
tag=                  # experiment tag (default: derived from train_config)
resume=true           # continue from the last checkpoint in exp/<tag>
train_threads=0       # torch threads per training process (0: the CPUs this job may use / processes)

# Embedding options (stage 5).
embed_sets=           # data dirs to embed (default: test sets and valid set)
embed_batch_size=32   # utterances per batch in extraction
extract_train=false   # also embed the training set (as a TTS recipe would)
embed_opts=           # more options for scripts/spk/extract_embeddings.sh (e.g. "--num-workers 2 --max-frames 30000")
embed_toolkit=spkflow # the model of stages 5-6: spkflow (trained here, stages 2-4) | espnet | speechbrain | wespeaker
embed_model=          # with another embed_toolkit: the pretrained model (its dir, or a WeSpeaker .onnx);
                      # stages 2-4 and 7 are skipped, results go to exp/spk_<tag> (default tag: the model's name)

# Scoring options (stage 6).
score_norm=false      # adaptive s-norm with a cohort from the training set
cohort_size=200       # cohort speakers for score normalisation
score_center=false   # subtract the training speakers' mean embedding before scoring
score_eval_mean=false  # centre on each test set's own mean instead (no labels used; with a backend it replaces
                       # the backend's training mean): unlabelled in-domain centring, as Kaldi's SRE16 recipe does
score_backend=cosine  # cosine | wccn | lda: a linear backend fitted on the training set's utterance embeddings
backend_reg=0.1       # its within-class covariance shrinkage (spkflow.score.backend)
score_skip_missing=false  # leave out trials naming an utterance without an embedding (counted) instead of failing

help_message=$(cat <<EOM
Usage: $0 [options]
  --stage / --stop_stage   stages to run (1 data, 2 fbank, 3 batches, 4 train, 5 embed, 6 score, 7 pack)
  --nj, --ngpu, --nproc, --num_nodes   parallelism (ngpu/nproc per node; num_nodes > 1 needs cmd_backend=slurm)
  --train_set, --test_sets, --valid_set
  --fbank_conf, --vad_conf, --skip_bad, --fbank_compress
  --num_spk, --num_utt, --num_epochs, --batch_seed, --short_speakers
  --train_config, --tag, --resume, --train_threads
  --embed_sets, --embed_batch_size, --gpu_inference, --extract_train, --embed_opts
  --embed_toolkit spkflow|espnet|speechbrain|wespeaker, --embed_model DIR   (score a pretrained model)
  --score_norm, --cohort_size, --score_center, --score_eval_mean, --score_backend cosine|wccn|lda, --backend_reg,
  --score_skip_missing
EOM
)

log "$0 $*"
. utils/parse_options.sh

if [ $# -ne 0 ]; then
    log "${help_message}"
    log "Error: unknown arguments: $*"
    exit 2
fi

. ./path.sh
. ./cmd.sh

# Fail now rather than after stages 1-3: only a scheduler spans nodes (scripts/spk/train.sh checks too).
if [ "${num_nodes}" -gt 1 ] && [ "$(basename "${cuda_cmd%% *}")" != slurm.pl ] \
    && [ "${stage}" -le 4 ] && [ "${stop_stage}" -ge 4 ]; then
    log "Error: --num_nodes ${num_nodes} needs cmd_backend=slurm in cmd.sh (cuda_cmd is '${cuda_cmd}', which runs on this machine only)"
    exit 2
fi

case "${embed_toolkit}" in
    spkflow) train_here=true ;;
    espnet|speechbrain|wespeaker)
        train_here=false  # a pretrained model: nothing to train or pack
        if [ -z "${embed_model}" ] || [ ! -e "${embed_model}" ]; then
            log "Error: --embed_toolkit ${embed_toolkit} needs --embed_model (the pretrained model), got '${embed_model}'"
            exit 2
        fi
        [ -z "${tag}" ] && tag=$(basename "${embed_model}" .onnx) ;;
    *) log "Error: --embed_toolkit must be spkflow, espnet, speechbrain or wespeaker, got '${embed_toolkit}'"; exit 2 ;;
esac
if ! ${train_here} && [ "${stage}" -le 4 ] && [ "${stop_stage}" -ge 2 ]; then
    log "Stages 2-4 skipped: stages 5-6 use the pretrained ${embed_toolkit} model ${embed_model}"
fi
[ -z "${tag}" ] && tag=$(basename "${train_config}" .yaml)
spk_exp=${expdir}/spk_${tag}
[ -z "${valid_set}" ] && valid_set=${test_sets%% *}
[ -z "${embed_sets}" ] && embed_sets=$(echo "${test_sets} ${valid_set}" | tr ' ' '\n' | awk 'NF && !seen[$0]++' | tr '\n' ' ')
${extract_train} && embed_sets="${train_set} ${embed_sets}"
# Score normalisation, centring and a backend use the training set's embeddings: stage 5 then
# embeds the training set and stage 6 reads its spk_xvector.scp / xvector.scp (one test for both stages).
case "${score_backend}" in cosine|wccn|lda) ;; *) log "Error: --score_backend must be cosine, wccn or lda, got '${score_backend}'"; exit 2 ;; esac
if [ "${score_backend}" != cosine ] && ${score_center}; then
    log "Error: --score_backend ${score_backend} centres on the training mean itself: set --score_center false"
    exit 2
fi
if ${score_center} && ${score_eval_mean}; then
    log "Error: --score_center true and --score_eval_mean true: centre on the training mean or on each set's own, not both"
    exit 2
fi
train_cohort=false
if ${score_norm} || ${score_center} || [ "${score_backend}" != cosine ]; then train_cohort=true; fi

if [ ${stage} -le 1 ] && [ ${stop_stage} -ge 1 ]; then
    log "Stage 1: data preparation (local/data.sh) into data/{${train_set},${test_sets// /,}}"
    # shellcheck disable=SC2086  # local_data_opts is a list of options, split into words on purpose
    local/data.sh ${local_data_opts}
    # Every set must be a valid data dir; the sets that are scored need a trials list.
    for dset in $(echo "${train_set} ${test_sets} ${valid_set}" | tr ' ' '\n' | awk 'NF && !seen[$0]++'); do
        utils/validate_data_dir.sh --no-feats --no-text "data/${dset}"
        if [ "${dset}" != "${train_set}" ] && [ ! -s "data/${dset}/trials" ]; then
            log "Error: data/${dset}/trials is missing: local/data.sh must write a trials list for each test set"
            exit 1
        fi
        info="$(wc -l < "data/${dset}/spk2utt") speakers, $(wc -l < "data/${dset}/utt2spk") utterances"
        if [ -s "data/${dset}/utt2dur" ]; then
            info+=$(awk '{s += $2} END {printf ", %.2f h", s / 3600}' "data/${dset}/utt2dur")
        fi
        if [ -s "data/${dset}/trials" ]; then
            info+=$(awk '{n[$3]++} END {printf ", trials: %d target + %d nontarget", n["target"], n["nontarget"]}' "data/${dset}/trials")
        fi
        log "data/${dset}: ${info}"
    done
    log "Stage 1 output: data dirs in $(pwd)/data"
fi

if ${train_here} && [ ${stage} -le 2 ] && [ ${stop_stage} -ge 2 ]; then
    log "Stage 2: fbank + energy VAD with ${fbank_conf}, ${nj} jobs: data/<set> -> ${dumpdir}/fbank/<set>"
    # Every set a later stage reads: training, validation, evaluation and embedding sets.
    # scripts/feats/make_fbank.sh copies data/<set> to the dump dir and adds feats.scp, vad.scp,
    # utt2num_frames and per-utterance CMVN stats; with --skip_bad true unreadable utterances
    # are listed in bad_utts and left out of the copy.
    _sets=$(echo "${train_set} ${valid_set} ${test_sets} ${embed_sets}" | tr ' ' '\n' | awk 'NF && !seen[$0]++')
    # Scale facts before the work: hours of audio, estimated arks (float and compressed), free disk.
    # shellcheck disable=SC2046,SC2086  # _sets: a list of set names, split into words on purpose
    python -m spkflow.bin.scale_facts --fbank-conf "${fbank_conf}" --compress "${fbank_compress}" \
        --out-dir "${dumpdir}" $(printf 'data/%s ' ${_sets}) 2>&1 | sed 's/^.*INFO: //; s/^.*WARNING: /Warning: /' \
        | while read -r _line; do log "${_line}"; done || true
    for _set in ${_sets}; do
        if [ ! -f "data/${_set}/wav.scp" ]; then
            log "Error: data/${_set}/wav.scp not found (run stage 1)"
            exit 1
        fi
        scripts/feats/make_fbank.sh --cmd "${train_cmd}" --nj "${nj}" \
            --fbank-conf "${fbank_conf}" --vad-conf "${vad_conf}" \
            --compress "${fbank_compress}" --skip-bad "${skip_bad}" \
            "data/${_set}" "${dumpdir}/fbank/${_set}"
        if [ -s "${dumpdir}/fbank/${_set}/bad_utts" ]; then
            log "Warning: $(wc -l < "${dumpdir}/fbank/${_set}/bad_utts") utterances of ${_set} left out, see ${dumpdir}/fbank/${_set}/bad_utts"
        fi
    done
fi

if ${train_here} && [ ${stage} -le 3 ] && [ ${stop_stage} -ge 3 ]; then
    log "Stage 3: ${num_spk} x ${num_utt} batch lists for ${num_epochs} epochs -> ${spk_exp}/batches"
    # One file per epoch, epochs numbered from 1 (ESPnet style): epoch<E>.txt, one batch per line,
    # N*M utterance ids speaker-major (spkflow/train/batches.py plans them; make_batches writes them).
    # Stage 2 copies the data dir to ${dumpdir}/fbank (minus unreadable utterances), so its
    # spk2utt is the one training can load; fall back to data/ when stage 2 is not used.
    _spk2utt=${dumpdir}/fbank/${train_set}/spk2utt
    [ -f "${_spk2utt}" ] || _spk2utt=data/${train_set}/spk2utt
    [ -f "${_spk2utt}" ] || { log "Error: no spk2utt: ${dumpdir}/fbank/${train_set}/spk2utt nor ${_spk2utt}"; exit 1; }
    _bdir=${spk_exp}/batches
    mkdir -p "${_bdir}/log"
    # Plans already written are reused only if made from the same spk2utt and settings.
    _settings="spk2utt=${_spk2utt} md5=$(md5sum < "${_spk2utt}" | cut -d' ' -f1) num_spk=${num_spk} num_utt=${num_utt} seed=${batch_seed} short_speakers=${short_speakers}"
    if [ ! -f "${_bdir}/settings" ] || [ "$(cat "${_bdir}/settings")" != "${_settings}" ]; then
        if compgen -G "${_bdir}/epoch*.txt" > /dev/null; then
            log "Batch settings changed (now: ${_settings}): removing the old plans"
            rm -f "${_bdir}"/epoch*.txt
        fi
        echo "${_settings}" > "${_bdir}/settings"
    fi
    # One line here for all epochs; one line per epoch in ${_bdir}/log/summary.txt.
    _summary=${_bdir}/log/summary.txt
    _made=0
    _kept=0
    for _epoch in $(seq 1 "${num_epochs}"); do
        _out=${_bdir}/epoch${_epoch}.txt
        if [ -f "${_out}" ]; then
            _kept=$((_kept + 1))
            continue
        fi
        _log=${_bdir}/log/make_batches.epoch${_epoch}.log
        if ! python -m spkflow.bin.make_batches --spk2utt "${_spk2utt}" --num-spk "${num_spk}" \
                --num-utt "${num_utt}" --seed "${batch_seed}" --epoch "${_epoch}" \
                --short-speakers "${short_speakers}" --out "${_out}" 2> "${_log}"; then
            log "Error: batch planning for epoch ${_epoch} failed, see ${_log}:"
            cat "${_log}" >&2
            exit 1
        fi
        _made=$((_made + 1))
    done
    for _epoch in $(seq 1 "${num_epochs}"); do
        _log=${_bdir}/log/make_batches.epoch${_epoch}.log
        echo "Epoch ${_epoch}: $(grep -o '[0-9]* batches of .*' "${_log}" 2> /dev/null || echo "planned before, no log")"
    done > "${_summary}"
    # batches per epoch and coverage over all epochs, from the per-epoch lines
    _range=$(awk 'function span(lo, hi, unit) { return lo == hi ? lo unit : lo unit "-" hi unit }
                  { for (i = 1; i < NF; i++) {
                        if ($(i + 1) == "batches" && $(i + 2) == "of") { b = $i + 0; if (!nb++ || b < bl) bl = b; if (b > bh) bh = b }
                        if ($i == "coverage") { c = $(i + 1) + 0; if (!nc++ || c < cl) cl = c; if (c > ch) ch = c } } }
                  END { if (nb && nc) printf "%s batches per epoch, coverage %s", span(bl, bh, ""), span(cl, ch, "%") }' \
                 "${_summary}" 2> /dev/null || true)
    log "${num_epochs} batch lists (${_made} planned, ${_kept} kept): ${_range:-see ${_summary}}; per epoch: ${_summary}"
fi

if ${train_here} && [ ${stage} -le 4 ] && [ ${stop_stage} -ge 4 ]; then
    log "Stage 4: training with ${train_config} -> ${spk_exp}"
    # spkflow/train/trainer.py: N x M crops of the stage-2 features in the order of the stage-3 batch
    # lists, a checkpoint each epoch (resumable mid-epoch), validation EER on ${valid_set}'s
    # trials, model.pth = the model chosen by train.select; config.yaml records the frontend.
    # ngpu > 1 or nproc > 1: DDP through torchrun, rank r trains on lines r, r+W, ... of each list
    # (W = num_nodes x processes per node).
    _train_dir=${dumpdir}/fbank/${train_set}
    [ -f "${_train_dir}/feats.scp" ] || { log "Error: ${_train_dir}/feats.scp not found (run stage 2)"; exit 1; }
    for _epoch in $(seq 1 "${num_epochs}"); do
        [ -f "${spk_exp}/batches/epoch${_epoch}.txt" ] || {
            log "Error: ${spk_exp}/batches/epoch${_epoch}.txt not found (run stage 3 with --num_epochs ${num_epochs})"; exit 1; }
    done
    _opts=(--cmd "${cuda_cmd}" --num-nodes "${num_nodes}" --ngpu "${ngpu}" --nproc "${nproc}"
           --train-config "${train_config}" --num-epochs "${num_epochs}" --num-utt "${num_utt}"
           --fbank-conf "${fbank_conf}" --vad-conf "${vad_conf}" --resume "${resume}"
           --num-threads "${train_threads}")
    if [ -n "${valid_set}" ] && [ -f "data/${valid_set}/trials" ] && [ -f "${dumpdir}/fbank/${valid_set}/feats.scp" ]; then
        _opts+=(--valid-data "data/${valid_set}" --valid-feats "${dumpdir}/fbank/${valid_set}")
    else
        log "No validation: data/${valid_set}/trials or ${dumpdir}/fbank/${valid_set}/feats.scp missing"
    fi
    # scripts/spk/train.sh: one process, torchrun --standalone (nproc/ngpu > 1) or, with
    # num_nodes > 1, one Slurm job of num_nodes torchrun agents (c10d rendezvous); it keeps
    # an earlier train.log as train.log.<N> and names the failed ranks' logs.
    if ! scripts/spk/train.sh "${_opts[@]}" "${_train_dir}" "${spk_exp}/batches" "${spk_exp}"; then
        if [ -f "${spk_exp}/checkpoint.pth" ]; then
            log "Error: training failed or was stopped; ${spk_exp}/checkpoint.pth is kept: re-running stage 4 (--stage 4, same options) resumes from it"
        else
            log "Error: training failed before its first checkpoint, see ${spk_exp}/train.log"
        fi
        exit 1
    fi
    # one line for the whole run; every epoch is in train.log and history.json
    _summary=$(python - "${spk_exp}/history.json" <<'PYEOF' 2> /dev/null || true
import json, sys
h = json.load(open(sys.argv[1]))["history"]
eers = [(r["epoch"], r["valid_eer"]) for r in h if r.get("valid_eer") is not None]
line = f"{len(h)} epochs, {h[-1]['steps']} steps, {sum(r['seconds'] for r in h) / 60:.1f} min; train loss {h[0]['train_loss']:.3f} -> {h[-1]['train_loss']:.3f}"
if eers:
    best = min(eers, key=lambda e: e[1])
    line += f"; validation EER {eers[-1][1]:.2f}% at epoch {eers[-1][0]} (lowest {best[1]:.2f}% at epoch {best[0]})"
print(line)
PYEOF
)
    log "Trained: ${_summary:-see ${spk_exp}/history.json}; $(grep -o 'model.pth = .*' "${spk_exp}/train.log" | tail -1)"
    log "Stage 4 output: ${spk_exp}/model.pth, config.yaml, history.json, curves.png"
fi

if [ ${stage} -le 5 ] && [ ${stop_stage} -ge 5 ]; then
    _sets=${embed_sets}
    if ${train_cohort} && [[ " ${_sets} " != *" ${train_set} "* ]]; then
        _sets="${train_set} ${_sets}"  # stage 6 needs the training speakers' mean embeddings
    fi
    if ${train_here}; then
        _model=${spk_exp}
        for _f in config.yaml model.pth; do
            [ -f "${spk_exp}/${_f}" ] || { log "Error: ${spk_exp}/${_f} not found (stage 4 writes the model)"; exit 1; }
        done
    else
        _model=${embed_model}
        mkdir -p "${spk_exp}"
        echo "${embed_toolkit} ${embed_model}" > "${spk_exp}/pretrained_model"
    fi
    log "Stage 5: embedding extraction for ${_sets} with the ${embed_toolkit} model ${_model} -> ${spk_exp}/embed/<set>"
    if ${gpu_inference}; then
        _cmd=${cuda_cmd}; _device=cuda   # one GPU per job (--gpu 1)
    else
        _cmd=${decode_cmd}; _device=cpu
    fi
    for dset in ${_sets}; do
        # shellcheck disable=SC2086
        scripts/spk/extract_embeddings.sh --cmd "${_cmd}" --nj "${nj}" --device "${_device}" \
            --batch-size "${embed_batch_size}" --toolkit "${embed_toolkit}" --skip-bad "${skip_bad}" ${embed_opts} \
            --model-dir "${_model}" "data/${dset}" "${spk_exp}/embed/${dset}"
    done
fi

if [ ${stage} -le 6 ] && [ ${stop_stage} -ge 6 ]; then
    log "Stage 6: scoring trials of ${test_sets} -> ${spk_exp}/eval/<set>"
    _score_opts=(--model-tag "spk_${tag}" --skip-missing "${score_skip_missing}" --results-md "${spk_exp}")
    _cohort=${spk_exp}/embed/${train_set}/spk_xvector.scp
    if ${train_cohort} && [ ! -f "${_cohort}" ]; then
        log "Error: score_norm/score_center/score_backend need the training speakers' embeddings ${_cohort}: run stage 5 with the same options (it then embeds ${train_set})"
        exit 1
    fi
    ${score_norm} && _score_opts+=(--cohort-scp "${_cohort}" --cohort-size "${cohort_size}")
    ${score_center} && _score_opts+=(--mean-scp "${_cohort}")
    _score_opts+=(--eval-mean "${score_eval_mean}")
    if [ "${score_backend}" != cosine ]; then
        _backend=${spk_exp}/backend/${score_backend}.npz
        mkdir -p "${spk_exp}/backend/log"
        log "Fitting the ${score_backend} backend on ${spk_exp}/embed/${train_set}/xvector.scp -> ${_backend}"
        if ! python -m spkflow.bin.fit_backend --backend "${score_backend}" --reg "${backend_reg}" \
                --xvector-scp "${spk_exp}/embed/${train_set}/xvector.scp" --utt2spk "data/${train_set}/utt2spk" \
                --out "${_backend}" > "${spk_exp}/backend/log/fit_${score_backend}.log" 2>&1; then
            tail -n 3 "${spk_exp}/backend/log/fit_${score_backend}.log" >&2
            log "Error: fitting the backend failed, see ${spk_exp}/backend/log/fit_${score_backend}.log"
            exit 1
        fi
        _score_opts+=(--backend "${_backend}")
    fi
    for dset in ${test_sets}; do
        for _f in "data/${dset}/trials" "${spk_exp}/embed/${dset}/xvector.scp"; do
            [ -f "${_f}" ] || { log "Error: ${_f} not found (stage 1 writes trials, stage 5 embeddings)"; exit 1; }
        done
        scripts/spk/score.sh "${_score_opts[@]}" "data/${dset}/trials" \
            "${spk_exp}/embed/${dset}/xvector.scp" "${spk_exp}/eval/${dset}"
    done
    log "Results: ${spk_exp}/RESULTS.md, plots in ${spk_exp}/eval/<set>/{det,score_hist}.png"
fi

if ! ${train_here} && [ ${stage} -le 7 ] && [ ${stop_stage} -ge 7 ]; then
    log "Stage 7 skipped: a pretrained ${embed_toolkit} model is not packed (pack spkflow models)"
elif [ ${stage} -le 7 ] && [ ${stop_stage} -ge 7 ]; then
    _packed=${spk_exp}/packed/spk_${tag}.zip
    log "Stage 7: pack ${spk_exp} (config, weights, fbank/vad conf, RESULTS.md, model card) -> ${_packed}"
    for _f in config.yaml model.pth; do
        [ -f "${spk_exp}/${_f}" ] || { log "Error: ${spk_exp}/${_f} not found (stage 4 writes the model)"; exit 1; }
    done
    python -m spkflow.bin.pack --model-dir "${spk_exp}" --out "${_packed}" --name "spk_${tag}"
    log "Stage 7 output: ${_packed} (use it as --model-dir, or Embedder.from_pretrained; README.md inside)"
fi

log "Successfully finished. [elapsed=${SECONDS}s]"
