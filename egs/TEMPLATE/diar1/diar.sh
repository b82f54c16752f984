#!/usr/bin/env bash
# Staged driver for diarization recipes: who spoke when in long recordings, from the embeddings of
# sliding windows, with a speaker model trained by a spk1 recipe (or any toolkit's).
#
#   ./run.sh                                                   # the spk1 demo model, every stage
#   ./run.sh --spk_model ../spk1/exp/spk_train/packed/spk_train.zip   # or its pack
#   ./run.sh --pretrained DIR --pretrained_toolkit speechbrain          # or another toolkit's model
#   ./run.sh --stage 4 --cluster_method ahc                    # cluster the same embeddings again
#
# Stages: 1 data prep (local/data.sh: recording dirs with wav.scp, rttm, uem), checked;
#         2 speech regions (oracle | silero | energy) and sliding windows as a data dir with segments;
#         3 window embeddings (scripts/spk/extract_embeddings.sh: stage 5 of spk1, unchanged);
#         4 clustering (the pipeline, and the plain baseline beside it; with --overlap oracle also the
#           pipeline with a second speaker in the reference's overlapped speech) -> one RTTM per set;
#         5 scoring (DER forgiving / fair / full, JER, speaker-count error; a plot) and RESULTS.md.
# Outputs: ${expdir}/diar_<tag>/<set>.<windows>/<system>/{hyp.rttm,scores.md,scores.json,plot_*.png}
set -euo pipefail

# A recipe folder holds path.sh, cmd.sh, utils/ and scripts/.
for _f in path.sh cmd.sh utils/parse_options.sh utils/supervise.sh scripts/lib/help.sh local/data.sh; do
    if [ ! -e "${_f}" ]; then
        echo "${0##*/}: no ${_f} in $(pwd): run it from a recipe folder, e.g. cd egs/speechocean762/diar1 && ./run.sh" >&2
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
nj=                   # parallel embedding jobs (default: the CPU cores, at most 4)
expdir=exp            # where experiments go
dumpdir=dump          # where speech regions and windows go

# Data options.
sets="sim ami"        # recording dirs under data/ (wav.scp, rttm, optional uem and reco2dur)
local_data_opts=      # options passed to local/data.sh

# Model options.
spk_model=../spk1/exp/spk_train  # a spk1 model dir (config.yaml + model.pth, scoring.yaml) or its packed .zip
pretrained=           # another toolkit's model instead (a dir, or a WeSpeaker .onnx), with pretrained_toolkit
pretrained_toolkit=spkflow  # spkflow | espnet | speechbrain | wespeaker | resemblyzer (another toolkit's: plain cosine)
tag=                  # experiment tag: exp/diar_<tag> (default: the model's name)

# Speech and window options (stage 2).
speech=oracle         # speech regions: oracle (union of the reference turns) | silero (the library's default
                      # detector) | energy (energy VAD)
silero_opts=          # silero's rules, e.g. "onset=0.4,min_silence=0.25" (default: spkflow.diar.speech.SileroOptions)
window=1.5            # window length (s)
shift=0.75            # window shift (s)
min_window=0.5        # speech regions shorter than this get no window (their time takes a neighbour's label)

# Embedding options (stage 3).
embed_batch_size=64   # windows per batch
embed_opts=           # more options for scripts/spk/extract_embeddings.sh

# Clustering options (stage 4).
cluster_method=spectral  # spectral (auto-tuned, count estimated) | ahc (stopped at the model's calibrated LLR 0)
num_speakers=         # empty: estimated; a number: that many; oracle: the reference's count per recording
max_speakers=8        # bound on the estimated speaker count
backend=true          # cluster in the model's scoring space (its backend, e.g. WCCN)
centre="set"          # centre on: set (every window of the set's recordings, no labels), none (the scoring's
                      # training mean) or recording (its own windows; in a one-speaker recording, that speaker)
resegment=auto        # reassign windows to the nearest speaker, smoothed (auto: the count given, or 600+ windows)
threshold=            # where AHC stops: empty, the model's calibrated decision (LLR 0 at its prior); or a
                      # number tuned on held-out recordings (an LLR; a cosine without a scoring of ours)
overlap=none          # none | oracle: also run the pipeline with a second speaker (the nearest other one in
                      # time) where the reference has overlapped speech: what an overlap detector could gain
baseline=true         # also run the plain baseline: L2-normalised embeddings + spectral clustering, nothing else

# Scoring options (stage 5).
plot=true             # plot reference against hypothesis for the first recording of each set

# shellcheck disable=SC1091  # scripts/ is the recipe's link to the project's scripts
help_message=$(. scripts/lib/help.sh; options_help "${BASH_SOURCE[0]}" \
    "Usage: $0 [options]   (stages 1 data, 2 speech + windows, 3 embed, 4 cluster, 5 score)")

log "$0 $*"
. utils/parse_options.sh

if [ $# -ne 0 ]; then
    log "${help_message}"
    log "Error: unknown arguments: $*"
    exit 2
fi

. ./path.sh
. ./cmd.sh

if [ -z "${nj}" ]; then
    nj=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc 2> /dev/null || echo 4)  # path.sh sets OMP_NUM_THREADS=1
    [ "${nj}" -gt 4 ] && nj=4
fi
case "${speech}" in oracle|energy|silero) ;; *) log "Error: --speech must be oracle, energy or silero, got '${speech}'"; exit 2 ;; esac
case "${overlap}" in none|oracle) ;; *) log "Error: --overlap must be none or oracle, got '${overlap}'"; exit 2 ;; esac
case "${cluster_method}" in spectral|ahc) ;; *) log "Error: --cluster_method must be spectral or ahc, got '${cluster_method}'"; exit 2 ;; esac
case "${pretrained_toolkit}" in
    spkflow|espnet|speechbrain|wespeaker|resemblyzer) ;;
    *) log "Error: --pretrained_toolkit must be spkflow, espnet, speechbrain, wespeaker or resemblyzer, got '${pretrained_toolkit}'"; exit 2 ;;
esac
if [ -n "${num_speakers}" ] && [ "${num_speakers}" != oracle ] && ! [[ "${num_speakers}" =~ ^[1-9][0-9]*$ ]]; then
    log "Error: --num_speakers must be empty, a positive number or 'oracle', got '${num_speakers}'"
    exit 2
fi

# The model: ours (a dir, or a pack unpacked into the experiment), or another toolkit's.
if [ -n "${pretrained}" ] && [ "${pretrained_toolkit}" != spkflow ]; then
    [ -e "${pretrained}" ] || { log "Error: --pretrained ${pretrained} not found"; exit 1; }
    model=${pretrained}; toolkit=${pretrained_toolkit}
elif [ "${pretrained_toolkit}" != spkflow ]; then
    log "Error: --pretrained_toolkit ${pretrained_toolkit} needs --pretrained (the ${pretrained_toolkit} model)"
    exit 2
else
    model=${pretrained:-${spk_model}}; toolkit=spkflow
    if [ ! -e "${model}" ] && [ "${stage}" -le 3 ] && [ "${stop_stage}" -ge 3 ]; then
        log "Error: the speaker model ${model} not found: train it first (cd ../spk1 && ./run.sh), or give --spk_model DIR|ZIP"
        exit 1
    fi
fi
[ -z "${tag}" ] && tag=$(basename "${model%/}" | sed -E 's/\.(zip|onnx)$//')
diar_exp=${expdir}/diar_${tag}
model_dir=${model}
if [ "${toolkit}" = spkflow ] && [ -f "${model}" ]; then
    model_dir=${diar_exp}/model  # a pack: verified and unpacked once (kept while it is the same pack)
fi
wtag=${speech}_w${window}s${shift}

if [ ${stage} -le 1 ] && [ ${stop_stage} -ge 1 ]; then
    log "Stage 1: data preparation (local/data.sh) into data/{${sets// /,}}"
    # shellcheck disable=SC2086  # local_data_opts is a list of options, split into words on purpose
    local/data.sh ${local_data_opts}
    for dset in ${sets}; do
        # spkflow/diar/recordings.py: sorted wav.scp, every rttm/uem line names a recording of it, turns inside
        python -m spkflow.bin.diar_data "data/${dset}" 2>&1 | sed 's/^.*INFO: //'
    done
fi

if [ ${stage} -le 2 ] && [ ${stop_stage} -ge 2 ]; then
    log "Stage 2: ${speech} speech regions and windows of ${window} s every ${shift} s: data/<set> -> ${dumpdir}/<set>.${wtag}"
    for dset in ${sets}; do
        _out=${dumpdir}/${dset}.${wtag}
        mkdir -p "${_out}/log"
        # spkflow/diar/recipe_stages.py make_windows: speech/ (segments = the regions), windows/ (the data dir stage 3 embeds)
        _sopts=()
        [ -n "${silero_opts}" ] && _sopts=(--silero-opts "${silero_opts}")
        if ! ${train_cmd} "${_out}/log/windows.log" python -m spkflow.bin.diar_windows --speech "${speech}" "${_sopts[@]}" \
                --window "${window}" --shift "${shift}" --min-window "${min_window}" "data/${dset}" "${_out}"; then
            log "Error: stage 2 failed on data/${dset}, see ${_out}/log/windows.log:"
            grep -v '^#' "${_out}/log/windows.log" | tail -n 3 >&2
            exit 1
        fi
        grep -o 'INFO: .*' "${_out}/log/windows.log" | sed 's/^INFO: //' | while read -r _line; do log "${_line}"; done
    done
fi

# A pack is verified and unpacked once, before the first stage that reads the model (3: the
# extraction; 4: the scoring), and kept while it is the same pack (spkflow.embed.packed).
if [ "${toolkit}" = spkflow ] && [ -f "${model}" ] && [ "${stage}" -le 4 ] && [ "${stop_stage}" -ge 3 ]; then
    log "Unpacking ${model} -> ${model_dir}"
    python -m spkflow.bin.pack --unpack "${model}" --out "${model_dir}"
fi

if [ ${stage} -le 3 ] && [ ${stop_stage} -ge 3 ]; then
    log "Stage 3: window embeddings with the ${toolkit} model ${model} -> ${diar_exp}/embed/<set>.${wtag}"
    for dset in ${sets}; do
        _windows=${dumpdir}/${dset}.${wtag}/windows
        if [ ! -f "${_windows}/segments" ]; then
            log "No windows in ${_windows} (no speech in data/${dset}): nothing to embed"
            continue
        fi
        # the stage-5 extraction of spk1 (parallel, batched, resumable; segments read by seeking); Resemblyzer's
        # trimming of long silences is for utterances: the windows are speech already, embedded whole
        _trim=(); [ "${toolkit}" = resemblyzer ] && _trim=(--trim-silences false)
        # shellcheck disable=SC2086
        scripts/spk/extract_embeddings.sh --cmd "${decode_cmd}" --nj "${nj}" --batch-size "${embed_batch_size}" \
            --toolkit "${toolkit}" "${_trim[@]}" ${embed_opts} --model-dir "${model_dir}" "${_windows}" \
            "${diar_exp}/embed/${dset}.${wtag}"
    done
fi

# system name -> options of spkflow.bin.diar_cluster
_systems=("pipeline:--method ${cluster_method} --backend ${backend} --centre ${centre} --resegment ${resegment}")
[ -n "${threshold}" ] && _systems[0]+=" --threshold ${threshold}"
${baseline} && _systems+=("baseline:--method spectral --backend false --centre none --resegment false")
# the model's scoring (backend, cohort, calibration) when it has one
_scoring=()
if [ "${toolkit}" = spkflow ] && [ -e "${model}" ] && [ -f "${model_dir}/scoring.yaml" ]; then
    _scoring=(--scoring-dir "${model_dir}")
elif [ "${cluster_method}" = ahc ] && [ -z "${num_speakers}" ] && [ -z "${threshold}" ]; then
    # AHC stops at the model's calibrated LLR: without a calibration, the count is estimated spectrally
    log "No scoring of ours for ${model} (scoring.yaml): plain cosine, spectral clustering instead of ahc (or give --num_speakers)"
    _systems[0]=${_systems[0]/--method ahc/--method spectral}
else
    log "No scoring of ours for ${model} (scoring.yaml): plain cosine scores"
fi
# the pipeline again, a second speaker in the reference's overlapped speech (<set>: each set's own)
[ "${overlap}" = oracle ] && _systems+=("pipeline_oracle_overlap:${_systems[0]#*:} --overlap-rttm data/<set>/rttm")

if [ ${stage} -le 4 ] && [ ${stop_stage} -ge 4 ]; then
    log "Stage 4: clustering (${cluster_method}; num_speakers=${num_speakers:-estimated}, at most ${max_speakers}) -> ${diar_exp}/<set>.${wtag}/<system>/hyp.rttm"
    for dset in ${sets}; do
        _dir=${diar_exp}/${dset}.${wtag}
        _count=()
        if [ "${num_speakers}" = oracle ]; then
            mkdir -p "${_dir}"
            awk '$1 == "SPEAKER" {print $2, $8}' "data/${dset}/rttm" | sort -u \
                | awk '{n[$1]++} END {for (r in n) print r, n[r]}' | sort > "${_dir}/reco2num_spk"
            _count=(--reco2num-spk "${_dir}/reco2num_spk")
        elif [ -n "${num_speakers}" ]; then
            _count=(--num-speakers "${num_speakers}")
        fi
        _scp=${diar_exp}/embed/${dset}.${wtag}/xvector.scp
        _emb=()
        [ -f "${_scp}" ] && _emb=(--xvector-scp "${_scp}")
        for _sys in "${_systems[@]}"; do
            _name=${_sys%%:*}
            _opts=${_sys#*:}
            mkdir -p "${_dir}/${_name}/log"
            # shellcheck disable=SC2086  # the system's options, split into words on purpose
            if ! ${train_cmd} "${_dir}/${_name}/log/cluster.log" python -m spkflow.bin.diar_cluster \
                    --work-dir "${dumpdir}/${dset}.${wtag}" "${_emb[@]}" "${_scoring[@]}" "${_count[@]}" \
                    --max-speakers "${max_speakers}" ${_opts//<set>/${dset}} --out "${_dir}/${_name}/hyp.rttm"; then
                log "Error: clustering ${dset} (${_name}) failed, see ${_dir}/${_name}/log/cluster.log:"
                grep -v '^#' "${_dir}/${_name}/log/cluster.log" | tail -n 3 >&2
                exit 1
            fi
            log "${dset} ${_name}: $(grep -o 'INFO: .*' "${_dir}/${_name}/log/cluster.log" | tail -n 1 | sed 's/^INFO: //')"
        done
    done
fi

if [ ${stage} -le 5 ] && [ ${stop_stage} -ge 5 ]; then
    log "Stage 5: scoring (pyannote.metrics; collar 0.25 s each side = pyannote collar=0.5) -> ${diar_exp}/RESULTS.md"
    for dset in ${sets}; do
        _dir=${diar_exp}/${dset}.${wtag}
        for _sys in "${_systems[@]}"; do
            _name=${_sys%%:*}
            _plot=()
            ${plot} && _plot=(--plot "")
            if ! ${train_cmd} "${_dir}/${_name}/log/score.log" python -m spkflow.bin.diar_score \
                    --title "${dset} ${_name} (${speech} speech)" "${_plot[@]}" "data/${dset}" \
                    "${_dir}/${_name}/hyp.rttm" "${_dir}/${_name}"; then
                log "Error: scoring ${dset} (${_name}) failed, see ${_dir}/${_name}/log/score.log:"
                grep -v '^#' "${_dir}/${_name}/log/score.log" | tail -n 3 >&2
                exit 1
            fi
            log "$(grep -o 'INFO: .*' "${_dir}/${_name}/log/score.log" | tail -n 1 | sed 's/^INFO: //')"
        done
    done
    # one table for the run: every set and system, from their scores.json
    python - "${diar_exp}" "${wtag}" "${model}" "${sets}" "${_systems[@]}" > "${diar_exp}/RESULTS.md.tmp" <<'PYEOF'
import json, sys
exp, wtag, model, sets, systems = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split(), sys.argv[5:]
print(f"# Diarization results: {exp}\n\nModel `{model}`, windows `{wtag}`. DER in % (forgiving: 0.25 s collar each side, "
      "overlap skipped; fair: 0.25 s collar; full: no collar), JER in %, speaker-count error = mean |hyp - ref| speakers.\n")
print("| set | system | options | DER forgiving | DER fair | DER full | JER | spk. count error |\n|---|---|---|---|---|---|---|---|")
for s in sets:
    for sysopt in systems:
        name, _, opts = sysopt.partition(":")
        t = json.load(open(f"{exp}/{s}.{wtag}/{name}/scores.json"))["total"]
        jer = "n/a" if t["jer"] is None else f"{t['jer']:.2f}"
        print(f"| {s} | {name} | `{opts}` | {t['der_forgiving']:.2f} | {t['der_fair']:.2f} | {t['der_full']:.2f} | {jer} | {t['spk_err']:.2f} |")
PYEOF
    mv "${diar_exp}/RESULTS.md.tmp" "${diar_exp}/RESULTS.md"
    cat "${diar_exp}/RESULTS.md"
fi

log "Successfully finished. [elapsed=${SECONDS}s]"
