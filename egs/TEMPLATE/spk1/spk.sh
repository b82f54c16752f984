#!/usr/bin/env bash
# Staged driver for speaker-embedder recipes (ESPnet/Kaldi conventions).
# A recipe's run.sh passes options; every stage reads and writes files only.
#
#   ./run.sh --stage 2 --stop_stage 5 --nj 8
#   ./run.sh --pretrained ../spk1/exp/spk_train/packed/spk_train.zip --test_sets mine --stage 5
#   ./run.sh --pretrained spkrec-ecapa-voxceleb --stage 5     # another toolkit's model, told from its files
#
# Stages: 1 data prep, 2 fbank + VAD, 3 N x M batch lists, 4 training,
#         5 embedding extraction, 6 scoring (backend, calibration; EER, minDCF, Cllr, plots),
#         7 pack the model and its scoring into one file.
set -euo pipefail

# A recipe folder holds path.sh, cmd.sh, utils/ and scripts/ (egs/TEMPLATE/spk1/setup.sh makes one).
for _f in path.sh cmd.sh utils/parse_options.sh utils/supervise.sh scripts/lib/help.sh; do
    if [ ! -e "${_f}" ]; then
        echo "${0##*/}: no ${_f} in $(pwd): run it from a recipe folder, e.g. cd egs/speechocean762/spk1 && ./run.sh" \
            "(a new one: egs/TEMPLATE/spk1/setup.sh egs/<corpus>/spk1)" >&2
        exit 1
    fi
done
. utils/supervise.sh  # a signal to this pid stops everything the run starts (spkflow.core.procs)

log() {
    local fname=${BASH_SOURCE[1]##*/}
    echo -e "$(date '+%Y-%m-%dT%H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*"
}
SECONDS=0

# General options.
stage=1               # first stage to run
stop_stage=10000      # last stage to run
nj=                   # parallel jobs for feature and embedding extraction (default: the CPU cores, at most 4;
                      # a value given is used as it is, e.g. for a cluster)
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
train_shards=false           # true: stage 2 also packs the training set's features into shards read front to back,
                             # stage 3 plans batches by windows of shards, stage 4 reads them (slow or network
                             # storage; the same crops; docs/batches.md)
shard_utts=1000              # with train_shards: utterances per shard
shard_pool=8                 # with train_shards: shards per window of the plan (a loader holds about twice this)
shard_streams=1              # with train_shards: interleaved streams of windows; training processes x loader
                             # workers gives each worker its own shards (else each reads every window)

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
resume_new_schedule=false  # true: resume although optim.lr/weight_decay, the scheduler or num_epochs changed
                           # (applied from the checkpoint on, recorded in config.yaml); other changes are refused
train_threads=0       # torch threads per training process (0: the CPUs this job may use / processes)

# Embedding options (stage 5).
embed_sets=           # data dirs to embed (default: test sets and valid set)
embed_batch_size=32   # utterances per batch in extraction
extract_train=false   # also embed the training set (as a TTS recipe would)
embed_opts=           # more options for scripts/spk/extract_embeddings.sh (e.g. "--num-workers 2 --max-frames 30000")

# Scoring options (stage 6).
score_norm=false      # adaptive s-norm with a cohort from the training set
cohort_size=200       # cohort speakers for score normalisation
score_center=false   # subtract the training speakers' mean embedding before scoring
score_eval_mean=false  # centre on each test set's own mean instead (no labels used; with a backend it replaces
                       # the backend's training mean): unlabelled in-domain centring, as Kaldi's SRE16 recipe does
score_backend=cosine  # cosine | wccn | lda: a linear backend fitted on the training set's utterance embeddings
backend_reg=0.1       # its within-class covariance shrinkage (spkflow.score.backend)
score_skip_missing=false  # leave out trials naming an utterance without an embedding (counted) instead of failing
score_qmf=false       # quality-measure calibration (QMF): fitted on trials drawn from the training set's embeddings,
                      # calibrated scores in eval/<set>/scores.qmf and metrics.json's "qmf" (WeSpeaker's, ESPnet's qmf)
qmf_trials=20000      # QMF: target trials drawn from the training set, and as many non-target

calibrate=true        # stage 6 fits a score calibration (LLRs, same-speaker decisions; stage 7 packs it);
                      # false: scores only, and no training-set embeddings for it (SID's stage 5)
calib_set=            # data set (under data/, with trials) whose scores fit the score calibration; its calibrated
                      # figures are then in-sample (empty: trials drawn from the training set, at most 8
                      # utterances per speaker; the model has seen them, so its LLRs are overconfident elsewhere)
calib_prior=0.5       # target prior of the same-speaker decision (equal costs): LLR threshold -logit(prior)

# Pretrained model options (stages 5-6 on new data, no training).
pretrained=           # a trained model dir or packed .zip: stages 2-4 are skipped, stage 5 embeds with it into
                      # exp/<tag> (default tag: pretrained_<name>), stage 6 scores with its own packed scoring;
                      # or another toolkit's model (a dir, or an .onnx): stage 6 fits the scoring (backend,
                      # calibration) on the training set's embeddings as for a model trained here
pretrained_toolkit=   # the toolkit of --pretrained as extract_embeddings.sh --toolkit takes it (empty: from its files)

# shellcheck disable=SC1091  # scripts/ is the recipe's link to the project's scripts
help_message=$(. scripts/lib/help.sh; options_help "${BASH_SOURCE[0]}" \
    "Usage: $0 [options]   (a recipe's run.sh passes its options on; stages 1 data, 2 fbank, 3 batches, 4 train, 5 embed, 6 score, 7 pack)")

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

if [ -z "${nj}" ]; then
    nj=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2> /dev/null || echo 4)  # path.sh sets OMP_NUM_THREADS=1
    [ "${nj}" -gt 4 ] && nj=4
fi

# The model: trained here (exp/spk_<tag>), or a pretrained one; an exp dir unpacked from a pack
# is used like a pretrained one (its scoring and RESULTS.md are the pack's and stay as they are).
# Another toolkit's model has no scoring of ours: stage 6 fits one on the training set.
if [ -n "${pretrained}" ]; then
    # what the model is (spkflow.bin.model_info: its toolkit, whether it is ours, where its files are; a
    # pack is verified and unpacked once into the cache); what stage 5 cannot run is refused here
    _info=$(python -m spkflow.bin.model_info --jobs true ${pretrained_toolkit:+--toolkit "${pretrained_toolkit}"} "${pretrained}") || exit 1
    model_toolkit=; model_ours=; model_name=  # set by:
    eval "${_info}"  # model_toolkit, model_ours, model_dir, model_name, model_scoring
    [ -z "${tag}" ] && tag=pretrained_${model_name}
    spk_exp=${expdir}/${tag}
    packed_scoring=${model_ours}
elif [ -n "${pretrained_toolkit}" ]; then
    log "Error: --pretrained_toolkit ${pretrained_toolkit} needs --pretrained (the model)"
    exit 2
else
    [ -z "${tag}" ] && tag=$(basename "${train_config}" .yaml)
    spk_exp=${expdir}/spk_${tag}
    model_dir=${spk_exp}
    packed_scoring=false
    [ -f "${spk_exp}/.packed_meta.sha256" ] && packed_scoring=true
fi
[ -z "${valid_set}" ] && valid_set=${test_sets%% *}
# Stages 1, 5 and 6 ask spkflow/score/scoring_plan.py which sets they use and what stage 6 fits and scores
# (python -m spkflow.bin.scoring_plan ... show prints stage 6's steps); it refuses options that do not go together.
_plan=(--exp "${spk_exp}" --model_dir "${model_dir}" --pretrained "${pretrained}" --packed_scoring "${packed_scoring}"
       --train_set "${train_set}" --test_sets "${test_sets}" --valid_set "${valid_set}" --embed_sets "${embed_sets}"
       --extract_train "${extract_train}" --calibrate "${calibrate}" --calib_set "${calib_set}" --calib_prior "${calib_prior}"
       --score_norm "${score_norm}" --cohort_size "${cohort_size}" --score_center "${score_center}"
       --score_eval_mean "${score_eval_mean}" --score_backend "${score_backend}" --backend_reg "${backend_reg}"
       --score_skip_missing "${score_skip_missing}" --score_qmf "${score_qmf}" --qmf_trials "${qmf_trials}")
python -m spkflow.bin.scoring_plan "${_plan[@]}" check || exit 2
# Stage 4 reads stage 2's output for the training set unless it trains on audio alone
# (frontend.feats_type raw, no VAD, no global input statistics): then stages 2 and 4 skip it.
train_reads=features
if [ -z "${pretrained}" ] && [ "${stage}" -le 4 ] && [ "${stop_stage}" -ge 2 ] && [ -f "${train_config}" ]; then
    train_reads=$(python -m spkflow.bin.train_inputs --config "${train_config}") || exit 1
fi
# --train_shards true: the shards sit beside what stage 4 reads (features, or the audio files)
shard_dir=${dumpdir}/fbank/${train_set}/shards
[ "${train_reads}" = audio ] && shard_dir=data/${train_set}/shards

if [ ${stage} -le 1 ] && [ ${stop_stage} -ge 1 ]; then
    log "Stage 1: data preparation (local/data.sh) into data/{$([ -z "${pretrained}" ] && echo "${train_set},")${test_sets// /,}}"
    # shellcheck disable=SC2086  # local_data_opts is a list of options, split into words on purpose
    local/data.sh ${local_data_opts}
    # Every set must be a valid data dir; the sets that are scored need a trials list.
    # a pretrained model needs no training set, unless stage 6 fits its scoring there (another toolkit's)
    for dset in $(python -m spkflow.bin.scoring_plan "${_plan[@]}" data-sets); do
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

if [ -n "${pretrained}" ] && [ ${stage} -le 4 ] && [ ${stop_stage} -ge 2 ]; then
    log "Stages 2-4 skipped: the pretrained ${model_toolkit} model ${pretrained} is used (${spk_exp})"
fi

if [ -z "${pretrained}" ] && [ ${stage} -le 2 ] && [ ${stop_stage} -ge 2 ]; then
    log "Stage 2: fbank + energy VAD with ${fbank_conf}, ${nj} jobs: data/<set> -> ${dumpdir}/fbank/<set>"
    # Every set a later stage reads: training, validation, evaluation and embedding sets; not the
    # training set when stage 4 trains on its audio alone (spkflow.bin.train_inputs says "audio").
    # scripts/feats/make_fbank.sh copies data/<set> to the dump dir and adds feats.scp, vad.scp,
    # utt2num_frames and per-utterance CMVN stats; with --skip_bad true unreadable utterances
    # are listed in bad_utts and left out of the copy.
    _sets=$(echo "${train_set} ${valid_set} ${test_sets} $(python -m spkflow.bin.scoring_plan "${_plan[@]}" embed-sets)" \
        | tr ' ' '\n' | awk 'NF && !seen[$0]++')
    if [ "${train_reads}" = audio ] && [[ " ${valid_set} ${test_sets} " != *" ${train_set} "* ]]; then
        log "No features of ${train_set}: ${train_config} trains on its audio (stage 5 reads audio too)"
        _sets=$(echo "${_sets}" | grep -vx "${train_set}" || true)
    fi
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
    if ${train_shards}; then
        # spkflow/data/shard_jobs.py: runs of a speaker's utterances spread over the shards, each shard
        # written atomically by one of nj jobs; a rerun writes only the missing ones. They hold the
        # features (with frontend.vad their voiced frames only), or for frontend.feats_type raw the
        # audio files as stored.
        _holds=$(python -m spkflow.bin.train_inputs --config "${train_config}" --shards) || exit 1
        log "Shards of ${train_set}'s ${_holds} (${shard_utts} utterances each) -> ${shard_dir}"
        _audio=false; [ "${_holds}" = audio ] && _audio=true
        _voiced=false; [ "${_holds}" = "voiced features" ] && _voiced=true
        scripts/feats/make_shards.sh --cmd "${train_cmd}" --nj "${nj}" --shard-utts "${shard_utts}" \
            --audio "${_audio}" --voiced "${_voiced}" "$(dirname "${shard_dir}")" "${shard_dir}"
    fi
fi

if [ -z "${pretrained}" ] && [ ${stage} -le 3 ] && [ ${stop_stage} -ge 3 ]; then
    log "Stage 3: ${num_spk} x ${num_utt} batch lists for ${num_epochs} epochs -> ${spk_exp}/batches"
    # One file per epoch, epochs numbered from 1 (ESPnet style): epoch<E>.txt, one batch per line,
    # N*M utterance ids speaker-major (spkflow/train/batches.py plans them; make_batches writes them).
    # Stage 2 copies the data dir to ${dumpdir}/fbank (minus unreadable utterances), so its
    # spk2utt is the one training can load; fall back to data/ when stage 2 is not used.
    _spk2utt=${dumpdir}/fbank/${train_set}/spk2utt
    [ -f "${_spk2utt}" ] || _spk2utt=data/${train_set}/spk2utt
    [ -f "${_spk2utt}" ] || { log "Error: no spk2utt: ${dumpdir}/fbank/${train_set}/spk2utt nor ${_spk2utt}"; exit 1; }
    # The settings against the corpus first (spkflow/train/preflight.py): N x M vs its speakers (an error),
    # crops vs its voiced length and the model vs its size (warnings), each naming the option to change.
    _world=$((num_nodes * (ngpu > 0 ? ngpu : nproc)))
    _feats_dir=${dumpdir}/fbank/${train_set}
    [ "${train_reads}" = audio ] && _feats_dir=data/${train_set}
    _check=(--spk2utt "${_spk2utt}" --num-spk "${num_spk}" --num-utt "${num_utt}" --short-speakers "${short_speakers}"
            --world-size "${_world}" --train-dir "${_feats_dir}")
    [ -f "${train_config}" ] && _check+=(--config "${train_config}")  # (stage 4 says so when they are missing)
    [ -f "${fbank_conf}" ] && _check+=(--fbank-conf "${fbank_conf}")
    if ! python -m spkflow.bin.check_training "${_check[@]}" 2>&1 | while IFS= read -r _line; do log "${_line}"; done; then
        log "Error: stage 3 stopped before planning: change what the error above says"
        exit 1
    fi
    # The batch lists are what a training of ${spk_exp} reads: while another run trains there
    # (stage 4 holds ${spk_exp}'s lock, scripts/spk/train.sh) they are not touched. Held for stage 3.
    trap 'python -m spkflow.bin.lock release --pid "${spkflow_run_pid}" "${spk_exp}" || true' EXIT
    trap 'exit 130' INT; trap 'exit 143' TERM; trap 'exit 129' HUP  # the EXIT trap runs on these too
    python -m spkflow.bin.lock acquire --pid "${spkflow_run_pid}" --command "$0 (stage 3)" "${spk_exp}" || exit 1
    _bdir=${spk_exp}/batches
    mkdir -p "${_bdir}/log"
    # Plans already written are reused only if made from the same spk2utt and settings.
    _settings="spk2utt=${_spk2utt} md5=$(md5sum < "${_spk2utt}" | cut -d' ' -f1) num_spk=${num_spk} num_utt=${num_utt} seed=${batch_seed} short_speakers=${short_speakers}"
    _shard_opts=()  # --train_shards true: windows of shard_pool shards (spkflow/train/shard_plan.py)
    if ${train_shards}; then
        [ -f "${shard_dir}/shards.list" ] || { log "Error: ${shard_dir}/shards.list not found (run stage 2 with --train_shards true)"; exit 1; }
        _shard_opts=(--shards "${shard_dir}" --pool "${shard_pool}" --streams "${shard_streams}")
        _settings+=" shards=${shard_dir} md5=$(md5sum < "${shard_dir}/utt2shard" | cut -d' ' -f1) pool=${shard_pool} streams=${shard_streams}"
    fi
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
                --short-speakers "${short_speakers}" "${_shard_opts[@]}" --out "${_out}" 2> "${_log}"; then
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
    python -m spkflow.bin.lock release --pid "${spkflow_run_pid}" "${spk_exp}"
    trap - EXIT INT TERM HUP
fi

if [ -z "${pretrained}" ] && [ ${stage} -le 4 ] && [ ${stop_stage} -ge 4 ]; then
    log "Stage 4: training with ${train_config} -> ${spk_exp}"
    # spkflow/train/trainer.py: N x M crops of the stage-2 features in the order of the stage-3 batch
    # lists, a checkpoint each epoch (resumable mid-epoch), validation EER on ${valid_set}'s
    # trials, model.pth = the model chosen by train.select; config.yaml records the frontend.
    # ngpu > 1 or nproc > 1: DDP through torchrun, rank r trains on lines r, r+W, ... of each list
    # (W = num_nodes x processes per node).
    _train_dir=${dumpdir}/fbank/${train_set}
    if [ "${train_reads}" = audio ]; then
        _train_dir=data/${train_set}   # audio crops: wav.scp, no stage-2 output
    fi
    [ -f "${_train_dir}/feats.scp" ] || [ "${train_reads}" = audio ] || {
        log "Error: ${_train_dir}/feats.scp not found (run stage 2)"; exit 1; }
    for _epoch in $(seq 1 "${num_epochs}"); do
        [ -f "${spk_exp}/batches/epoch${_epoch}.txt" ] || {
            log "Error: ${spk_exp}/batches/epoch${_epoch}.txt not found (run stage 3 with --num_epochs ${num_epochs})"; exit 1; }
    done
    _opts=(--cmd "${cuda_cmd}" --num-nodes "${num_nodes}" --ngpu "${ngpu}" --nproc "${nproc}"
           --train-config "${train_config}" --num-epochs "${num_epochs}" --num-utt "${num_utt}"
           --fbank-conf "${fbank_conf}" --vad-conf "${vad_conf}" --resume "${resume}"
           --resume-new-schedule "${resume_new_schedule}"
           --num-threads "${train_threads}")
    ${train_shards} && _opts+=(--train-opts "--shards true")  # the crops from ${_train_dir}/shards
    if [ -n "${valid_set}" ] && [ -f "data/${valid_set}/trials" ] && [ -f "${dumpdir}/fbank/${valid_set}/feats.scp" ]; then
        _opts+=(--valid-data "data/${valid_set}" --valid-feats "${dumpdir}/fbank/${valid_set}")
    else
        log "No validation: data/${valid_set}/trials or ${dumpdir}/fbank/${valid_set}/feats.scp missing"
    fi
    # scripts/spk/train.sh: one process, torchrun --standalone (nproc/ngpu > 1) or, with
    # num_nodes > 1, one Slurm job of num_nodes torchrun agents (c10d rendezvous); it keeps
    # an earlier train.log as train.log.<N> and names the failed ranks' logs.
    if ! scripts/spk/train.sh "${_opts[@]}" "${_train_dir}" "${spk_exp}/batches" "${spk_exp}"; then
        log "Error: stage 4 failed; scripts/spk/train.sh said why and what to do just above"
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
    _sets=$(python -m spkflow.bin.scoring_plan "${_plan[@]}" embed-sets)  # each once; the training set when stage 6 needs it
    log "Stage 5: embedding extraction for ${_sets} with the model ${pretrained:-${model_dir}} -> ${spk_exp}/embed/<set>"
    if [ -n "${pretrained}" ]; then
        mkdir -p "${spk_exp}"
        echo "${model_toolkit} ${pretrained}" > "${spk_exp}/pretrained_model"
    else
        for _f in config.yaml model.pth; do
            [ -f "${model_dir}/${_f}" ] || { log "Error: ${model_dir}/${_f} not found (stage 4 writes the model)"; exit 1; }
        done
    fi
    if ${gpu_inference}; then
        _cmd=${cuda_cmd}; _device=cuda   # one GPU per job (--gpu 1)
    else
        _cmd=${decode_cmd}; _device=cpu
    fi
    for dset in ${_sets}; do
        # shellcheck disable=SC2086
        scripts/spk/extract_embeddings.sh --cmd "${_cmd}" --nj "${nj}" --device "${_device}" \
            --batch-size "${embed_batch_size}" ${pretrained_toolkit:+--toolkit "${pretrained_toolkit}"} \
            --skip-bad "${skip_bad}" ${embed_opts} --model-dir "${pretrained:-${model_dir}}" "data/${dset}" "${spk_exp}/embed/${dset}"
    done
fi

if [ ${stage} -le 6 ] && [ ${stop_stage} -ge 6 ]; then
    log "Stage 6: scoring trials of ${test_sets} -> ${spk_exp}/eval/<set>"
    # spkflow/score/scoring_plan.py: the backend, the calibration (on calib_set's trials, or trials drawn from the
    # training set) and the QMF fitted on the training set's embeddings, each with its log under ${spk_exp};
    # then scripts/spk/score.sh for each test set (eval/<set>/), RESULTS.md and scoring.yaml for stage 7.
    python -m spkflow.bin.scoring_plan "${_plan[@]}" run || exit 1
fi

if { [ -n "${pretrained}" ] || ${packed_scoring}; } && [ ${stage} -le 7 ] && [ ${stop_stage} -ge 7 ]; then
    log "Stage 7 skipped: ${model_dir} is a pretrained model, not trained here (nothing new to pack)"
elif [ ${stage} -le 7 ] && [ ${stop_stage} -ge 7 ]; then
    _packed=${spk_exp}/packed/spk_${tag}.zip
    log "Stage 7: pack ${spk_exp} (config, weights, fbank/vad conf, scoring, RESULTS.md, model card) -> ${_packed}"
    for _f in config.yaml model.pth; do
        [ -f "${spk_exp}/${_f}" ] || { log "Error: ${spk_exp}/${_f} not found (stage 4 writes the model)"; exit 1; }
    done
    python -m spkflow.bin.pack --model-dir "${spk_exp}" --out "${_packed}" --name "spk_${tag}"
    log "Stage 7 output: ${_packed} (use it as --model-dir, or Embedder.from_pretrained; README.md inside)"
fi

log "Successfully finished. [elapsed=${SECONDS}s]"
