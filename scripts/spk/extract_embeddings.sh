#!/usr/bin/env bash
# Speaker embeddings for a data dir: --nj parallel jobs through $cmd, batched, CPU or GPU, resumable.
#
#   scripts/spk/extract_embeddings.sh [--cmd run.pl] [--nj 4] [--batch-size 32] [--max-frames 3000] \
#       [--device cpu|cuda] [--toolkit spkflow|espnet|speechbrain|wespeaker|resemblyzer] [--skip-bad false] \
#       [--num-workers 1] [--num-threads 1] [--dtype float32|bfloat16|float16] [--fbank-on auto|workers|device] \
#       [--spk-mean raw|l2] [--model-file F] [--feats-dir D] [--trim-silences true|false] \
#       --model-dir DIR DATA_DIR OUT_DIR
#
# Writes (float32 Kaldi vectors; ESPnet reads them as type kaldi_ark):
#   OUT_DIR/xvector.scp       one embedding per utterance, keys in the data dir's LC_ALL=C order
#   OUT_DIR/spk_xvector.scp   mean of each speaker's utterance embeddings (spk2utt order)
#   OUT_DIR/bad_utts          with --skip-bad true: utterances left out, "utt reason"
#   OUT_DIR/bad_spks          speakers left without an embedding (all their utterances failed)
# Job outputs and commit logs under OUT_DIR/jobs/, one log per job under OUT_DIR/log/.
#
# The model (--model-dir) is opened by spkflow.embed.open_embedder, which tells its toolkit from its
# files unless --toolkit names it (python -m spkflow.bin.model_info says what it found):
# --toolkit spkflow: DIR is a stage-4 model dir (config.yaml + model.pth) or its pack (python -m
#   spkflow.bin.pack: verified and unpacked once into $SPKFLOW_CACHE, default ~/.cache/spkflow; jobs
#   on other hosts need it on a shared disk); audio -> fbank/VAD in DataLoader workers (or features
#   from --feats-dir, a stage-2 dump dir with feats.scp + vad.scp); --fbank-on device (the default on
#   cuda) computes them batched on the GPU instead, the workers then only decode and pad the audio
#   (spkflow/embed/native.py).  Our ONNX export runs through the API and spkflow.bin.verify, not here.
# --toolkit espnet: DIR holds an ESPnet speaker model's config.yaml and weights (model.pth, the
#   only *.pth, or --model-file); audio at the frontend's rate.
# --toolkit speechbrain: DIR is a SpeechBrain pretrained folder (hyperparams.yaml + *.ckpt, e.g. a
#   copy of speechbrain/spkrec-ecapa-voxceleb), loaded with no network (pip install '.[speechbrain]' in the checkout).
# --toolkit wespeaker: DIR holds a WeSpeaker ONNX export (feats -> embs) and optionally its training
#   config.yaml (fbank settings; default 80 bins, 25/10 ms, 16 kHz), or DIR is the .onnx file.
# --toolkit resemblyzer: DIR is Resemblyzer's pretrained.pt (GE2E LSTM d-vector) or the folder holding
#   it, e.g. the installed package's: $(python -c 'import resemblyzer, os; print(os.path.dirname(resemblyzer.__file__))')
#   (pip install '.[resemblyzer]' in the checkout); each utterance as embed_utterance(preprocess_wav(wav)),
#   webrtcvad's trimming of long silences included unless --trim-silences false.
# Every toolkit: batched so that each utterance gets its single-utterance embedding (docs/toolkits.md).
# --device cuda gives every job one GPU (--gpu 1 to $cmd; run.pl/queue.pl/slurm.pl set
#   CUDA_VISIBLE_DEVICES; the job uses the first visible device).
#
# Re-running resumes: utterances committed by an earlier (killed or failed) run are not computed
# again, unless the model changed (then the job outputs are discarded).  The final files are
# written only after the merge has checked that every utterance has exactly one embedding
# (listing missing and extra keys otherwise) and that all come from this model, all together
# (xvector.scp last) or none.  One run per OUT_DIR: a second one is refused naming the first.
set -euo pipefail
jobs_command="$0 $*"

root=$(cd -P "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
. "${root}/utils/supervise.sh"  # a signal to this pid stops everything the script starts
export PATH=${root}/utils:${PATH}
export PYTHONPATH=${root}${PYTHONPATH:+:${PYTHONPATH}}
export LC_ALL=C

cmd=run.pl          # job runner: run.pl | queue.pl ... | slurm.pl ...
nj=4                # number of parallel jobs
batch_size=32       # utterances per batch
max_frames=         # bound on padded 10 ms frames per batch (batch size x longest utterance);
                    # default 3000 on cpu (bigger batches cost more CPU time: caches), 60000 on cuda,
                    # divided by the encoder's frames per 10 ms (RawNet3 reads 1 ms frames: 300 / 6000)
device=cpu          # cpu | cuda (one GPU per job)
toolkit=            # spkflow (stage-4 model dir or pack) | espnet (ESPnet speaker model) |
                    # speechbrain (pretrained folder) | wespeaker (ONNX export) | resemblyzer (its .pt);
                    # empty: told from the files
model_dir=          # the model (required): a dir, a pack (.zip), a WeSpeaker .onnx or a Resemblyzer .pt
model_file=         # espnet: weights file (default: DIR/model.pth or the only *.pth in DIR);
                    # wespeaker: the .onnx (default: the only *.onnx in DIR)
feats_dir=          # spkflow: read features (feats.scp + vad.scp) from here instead of the audio
skip_bad=false      # leave unreadable utterances out (listed in OUT_DIR/bad_utts) instead of failing
num_workers=        # DataLoader worker processes per job (audio reading, features, padding);
                    # default 1 on cpu, 4 on cuda (so the GPU does not wait for the loader)
dtype=float32       # model precision: float32 | bfloat16 (cpu, cuda) | float16 (cuda only); part of the
                    # model stamp (resuming with another dtype recomputes); outputs are float32
fbank_on=auto       # spkflow: fbank/VAD in the loader workers (numpy) | on the model's device (torch,
                    # batched) | auto (device on cuda without --feats-dir); same numbers within 1e-5
num_threads=1       # torch threads per job (also passed to $cmd as --num-threads)
spk_mean=raw        # speaker means of raw vectors (ESPnet's convention) | l2 (of L2-normalised vectors)
trim_silences=      # resemblyzer: webrtcvad's trimming of long silences, as its preprocess_wav (true, the
                    # default) | false (the whole audio: windows of speech already found); in the stamp
python=             # python interpreter (default: utils/spkflow_python.sh: $SPKFLOW_PYTHON, python, .venv)

help_message=$(cat <<EOF
Usage: $0 [options] --model-dir <model-dir> <data-dir> <out-dir>
  e.g. $0 --nj 8 --model-dir exp/spk_train data/test exp/spk_train/embed/test
Options:
  --cmd CMD            job runner (default: ${cmd})
  --nj N               parallel jobs (default: ${nj})
  --batch-size B       utterances per batch (default: ${batch_size})
  --max-frames F       padded 10 ms frames per batch at most (default: 3000 on cpu, 60000 on cuda,
                       divided by the encoder's frames per 10 ms)
  --device DEV         cpu | cuda (default: ${device})
  --toolkit T          spkflow | espnet | speechbrain | wespeaker | resemblyzer (default: told from the files)
  --model-dir DIR      model directory (spkflow: or a packed model .zip; wespeaker: or the .onnx;
                       resemblyzer: or the .pt) (required)
  --model-file F       espnet / wespeaker: the weights file, when DIR has several
  --feats-dir D        spkflow: features from D/feats.scp (+ vad.scp) instead of audio
  --skip-bad BOOL      leave bad utterances out instead of failing (default: ${skip_bad})
  --num-workers K      DataLoader worker processes per job (default: 1 on cpu, 4 on cuda)
  --dtype D            float32 | bfloat16 | float16 (cuda only) (default: ${dtype})
  --fbank-on W         spkflow: auto | workers | device, where fbank runs (default: ${fbank_on})
  --num-threads N      torch threads per job (default: ${num_threads})
  --spk-mean M         raw | l2 speaker means (default: ${spk_mean})
  --trim-silences B    resemblyzer: trim long silences as its preprocess_wav (default: true)
EOF
)

. "${root}/scripts/lib/jobs.sh"   # parses the options, sets ${python}, defines log and jobs_*
[ $# -eq 2 ] || jobs_usage
data=$1
out=$2
export OMP_NUM_THREADS=${num_threads}
if [ -z "${num_workers}" ]; then
    if [[ "${device}" == cuda* ]]; then num_workers=4; else num_workers=1; fi
fi

# --- arguments, checked before any job starts
for v in nj batch_size max_frames num_threads; do
    [ "${v}" = max_frames ] && [ -z "${max_frames}" ] && continue  # the job picks the model's default
    if ! [[ "${!v}" =~ ^[0-9]+$ ]] || [ "${!v}" -lt 1 ]; then
        log "Error: --${v//_/-} must be a positive integer, got '${!v}'"
        exit 1
    fi
done
if ! [[ "${num_workers}" =~ ^[0-9]+$ ]]; then
    log "Error: --num-workers must be a non-negative integer, got '${num_workers}'"
    exit 1
fi
case "${device}" in cpu|cuda|cuda:*) ;; *) log "Error: --device must be cpu or cuda, got '${device}'"; exit 1 ;; esac
case "${dtype}" in float32|bfloat16|float16) ;; *) log "Error: --dtype must be float32, bfloat16 or float16, got '${dtype}'"; exit 1 ;; esac
if [ "${dtype}" = float16 ] && [[ "${device}" != cuda* ]]; then
    log "Error: --dtype float16 needs --device cuda; on cpu use bfloat16 or float32"
    exit 1
fi
case "${fbank_on}" in auto|workers|device) ;; *) log "Error: --fbank-on must be auto, workers or device, got '${fbank_on}'"; exit 1 ;; esac
case "${spk_mean}" in raw|l2) ;; *) log "Error: --spk-mean must be raw or l2, got '${spk_mean}'"; exit 1 ;; esac
case "${trim_silences}" in ''|true|false) ;; *) log "Error: --trim-silences must be true or false, got '${trim_silences}'"; exit 1 ;; esac
if [ -z "${model_dir}" ]; then
    log "Error: --model-dir is required"
    echo "${help_message}" >&2
    exit 1
fi
# The model: its toolkit and files (a pack: verified, and unpacked once into the cache), and whether the
# jobs can run it with these options; refused here, naming it, before any job starts.
model=${model_dir}
info=$("${python}" -m spkflow.bin.model_info --jobs true ${toolkit:+--toolkit "${toolkit}"} --dtype "${dtype}" \
    ${model_file:+--model-file "${model_file}"} ${feats_dir:+--feats-dir "${feats_dir}"} \
    --fbank-on "${fbank_on}" ${trim_silences:+--trim-silences "${trim_silences}"} "${model}") || exit 1
model_toolkit=; model_ours=  # set by:
eval "${info}"  # model_toolkit, model_ours, model_dir (a pack: its unpacked copy), ...
if [ -n "${feats_dir}" ] && [ ! -f "${feats_dir}/feats.scp" ]; then
    log "Error: --feats-dir ${feats_dir}: no feats.scp there"
    exit 1
fi
for f in wav.scp utt2spk; do
    if [ ! -s "${data}/${f}" ]; then
        log "Error: ${data}/${f} does not exist or is empty"
        exit 1
    fi
done
gpu_opt=
if [[ "${device}" == cuda* ]]; then
    gpu_opt="--gpu 1"
    if [ -z "${CUDA_VISIBLE_DEVICES+x}" ] && ! command -v nvidia-smi >/dev/null 2>&1 && [[ "${cmd}" == run.pl* ]]; then
        log "Warning: --device ${device} with run.pl but no nvidia-smi and no CUDA_VISIBLE_DEVICES here"
    fi
fi

jobs=${out}/jobs
mkdir -p "${out}"
jobs_lock "${out}"   # from here to the merge, no other run writes into ${out}
# The model's stamp: the toolkit and the hashes of the files that make its embeddings (config and
# weights; a missing or ambiguous file is named here, before anything is written).
stamp=$("${python}" -m spkflow.bin.model_stamp "${model_toolkit}" "${model_dir}" \
    ${model_file:+--model-file "${model_file}"} --dtype "${dtype}" ${trim_silences:+--trim-silences "${trim_silences}"}) \
    || exit 1
mkdir -p "${jobs}" "${out}/log"
if ${model_ours} && [ -z "${feats_dir}" ]; then  # recordings the jobs will upsample: named
    "${python}" -m spkflow.bin.audio_rates --model-dir "${model_dir}" "${data}" 2>&1 \
        | sed 's/^.*INFO: //; s/^.*WARNING: /Warning: /' >&2 || true
fi

# --- resume only with the same model (its stamp, computed above)
if [ -f "${jobs}/model.stamp" ] && [ "$(cat "${jobs}/model.stamp")" != "${stamp}" ]; then
    log "The model changed since ${jobs} was written: discarding its partial outputs"
    rm -rf "${jobs}"
    mkdir -p "${jobs}"
fi
if [ ! -f "${jobs}/model.stamp" ]; then
    tmp=$(mktemp "${jobs}/.model.stamp.XXXXXX")
    echo "${stamp}" > "${tmp}"
    mv "${tmp}" "${jobs}/model.stamp"
fi
# No complete-looking output until the merge has checked everything.
rm -f "${out}"/{xvector.scp,spk_xvector.scp,bad_utts,bad_spks} "${jobs}"/bad_utts.*

num_utts=$(wc -l < "${data}/utt2spk")
nj=$(jobs_clamp_nj "${nj}" "${data}/utt2spk")
done_before=$(cat "${jobs}"/xvector.*.scp 2>/dev/null | wc -l) || done_before=0
resumed=
[ "${done_before}" -gt 0 ] && resumed=", resuming after ${done_before} embeddings committed by an earlier run"
log "Embedding ${data} (${num_utts} utterances${resumed})" \
    "with ${model_toolkit} model ${model}, ${nj} jobs on ${device} (${dtype}), batch ${batch_size} -> ${out}"
rm -rf "${jobs}/split${nj}"
"${python}" -m spkflow.bin.split_by_duration "${data}" "${nj}" "${jobs}/split${nj}"

name=$(basename "${out}")
# shellcheck disable=SC2086
if ! ${cmd} ${gpu_opt} --num-threads "${num_threads}" JOB=1:"${nj}" "${out}/log/extract_${name}.JOB.log" \
        "${python}" -m spkflow.bin.extract_embeddings --toolkit "${model_toolkit}" --model-dir "${model_dir}" \
            ${model_file:+--model-file "${model_file}"} ${feats_dir:+--feats-dir "${feats_dir}"} \
            --keys "${jobs}/split${nj}/utts.JOB" --job-id JOB --device "${device}" \
            --batch-size "${batch_size}" ${max_frames:+--max-frames "${max_frames}"} --num-workers "${num_workers}" \
            --dtype "${dtype}" --fbank-on "${fbank_on}" --num-threads "${num_threads}" \
            ${trim_silences:+--trim-silences "${trim_silences}"} --skip-bad "${skip_bad}" "${data}" "${jobs}"; then
    jobs_report_failed "${out}/log/extract_${name}"
    if grep -q "cannot load the model: " "${out}/log/extract_${name}".*.log 2>/dev/null; then
        log "Error: the model cannot be used (see above); re-running with the same model will fail again"
    else
        log "Re-run the same command to resume: finished utterances are kept"
    fi
    exit 1
fi

if ! "${python}" -m spkflow.bin.merge_embeddings --skip-bad "${skip_bad}" --spk-mean "${spk_mean}" \
        "${data}" "${jobs}" "${out}" 2> "${out}/log/merge.log"; then
    cat "${out}/log/merge.log" >&2
    log "Error: merging the jobs of ${data} failed (${out}/log/merge.log)"
    exit 1
fi
grep -E "WARNING|bad utterance" "${out}/log/merge.log" >&2 || true
log "Succeeded: ${out}/xvector.scp ($(wc -l < "${out}/xvector.scp") utterances)," \
    "${out}/spk_xvector.scp ($(wc -l < "${out}/spk_xvector.scp") speakers)"
