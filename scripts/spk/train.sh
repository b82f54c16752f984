#!/usr/bin/env bash
# Stage 4 launcher: train a speaker embedder on one process, on P processes of one machine, or
# on K nodes x P processes of a Slurm job, always through torch's own launcher (torchrun).
#
#   scripts/spk/train.sh [--cmd run.pl] [--num-nodes 1] [--ngpu 0] [--nproc 1] \
#       [--train-config conf/train.yaml] [--num-epochs 10] [--num-utt M] \
#       [--valid-data data/test --valid-feats dump/fbank/test] [--fbank-conf F --vad-conf F] \
#       [--resume true] [--resume-new-schedule false] [--num-threads 0] [--train-opts "..."] \
#       TRAIN_DIR BATCHES_DIR EXP_DIR
#
# TRAIN_DIR: the stage-2 features dir of the training set (feats.scp, vad.scp, utt2spk), or its
# data dir (wav.scp, utt2spk) for a config that trains on audio alone (spkflow.bin.train_inputs);
# BATCHES_DIR: epoch<E>.txt of stage 3; EXP_DIR gets what spkflow.bin.train writes.
# Launch, by the number of processes (P = ngpu when ngpu > 0, else nproc):
#   K = 1, P = 1: python -m spkflow.bin.train
#   K = 1, P > 1: torchrun --standalone --nproc_per_node P (DDP: NCCL on GPUs, gloo on CPU)
#   K > 1:        CMD --num-nodes K: one Slurm job of K tasks, each running
#                 scripts/spk/torchrun_node.sh (torchrun --nnodes K --nproc_per_node P, c10d
#                 rendezvous on the job's first node, --max_restarts 0) under
#                 srun --kill-on-bad-exit=1. Needs CMD = slurm.pl; run.pl or queue.pl is an error.
# What it guarantees:
#   * One run per EXP_DIR: it is locked (spkflow.core.lock, scripts/lib/jobs.sh) before anything
#     there is written, for the whole job whatever the launch; a second run is refused naming
#     the first (host, pid, command). A signal to this script's pid stops the whole job
#     (utils/supervise.sh), with a checkpoint.
#   * EXP_DIR/train.log is this run's log (runner header, all ranks' output: rank 0 at INFO,
#     the others' warnings and errors); the log of an earlier run is kept as train.log.<N>.
#     Under DDP every rank also logs at INFO to EXP_DIR/log/train.rank<R>.log (kept alike).
#   * Exact resume (--resume true, the default): a run continues from EXP_DIR/checkpoint.pth
#     (written every epoch and, on SIGINT/SIGTERM, mid-epoch) with the same batch sequence,
#     whatever the launch (the rank split depends on the world size K x P only). A training
#     config that differs from the checkpoint's is refused, naming each key and both values;
#     --resume-new-schedule true continues with a new lr / schedule / number of epochs
#     (spkflow/train/resume.py).
#   * A failed or killed run exits non-zero, names train.log and the log of each rank that
#     torchrun reports failed (with its exit code or signal), shows the trainer's error and says
#     what to do: run the same command again to resume (after a signal or crash, or once the
#     error shown is fixed), never when that would fail the same way (a refused resume). A job
#     runner that could not start the job (no Slurm controller) is said to be the cause.
#     A run that ends before the last epoch (e.g. --max-steps) exits 1.
set -euo pipefail
jobs_command="$0 $*"   # names this run as the holder of EXP_DIR's lock

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
. "${root}/utils/supervise.sh"  # a signal to this pid stops everything the script starts
export PATH=${root}/utils:${PATH}
export PYTHONPATH=${root}${PYTHONPATH:+:${PYTHONPATH}}

cmd=run.pl          # job runner: run.pl (this machine) | slurm.pl ... (needed for num_nodes > 1)
num_nodes=1         # K: nodes (Slurm tasks), one torchrun agent each
ngpu=0              # GPUs per node: 0 = CPU; > 0 = that many CUDA processes per node (NCCL)
nproc=1             # CPU processes per node when ngpu = 0 (> 1: DDP with gloo)
train_config=conf/train.yaml  # training config (model, loss, optimiser, loader; train.amp for AMP on CUDA)
num_epochs=10       # epochs to train (batch lists epoch1..epoch<E>.txt)
num_utt=            # M utterances per speaker (empty: read from the lists)
valid_data=         # data dir with a trials file for validation EER (empty: no validation)
valid_feats=        # its features dir
fbank_conf=         # stage-2 fbank options, recorded in config.yaml
vad_conf=           # stage-2 VAD options, recorded in config.yaml
resume=true         # continue from EXP_DIR/checkpoint.pth (false: start afresh)
resume_new_schedule=false  # true: resume even with a changed lr / scheduler / epochs (applied from the checkpoint on)
num_threads=0       # torch threads per process (0: the CPUs of the job / processes per node)
rdzv_port=0         # multi-node rendezvous port (0: derived from the Slurm job id)
train_opts=         # more options for spkflow.bin.train (e.g. "--trace-batches")
python=             # python interpreter (default: utils/spkflow_python.sh)

help_message=$(cat <<EOF
Usage: $0 [options] <train-dir> <batches-dir> <exp-dir>
  e.g. $0 --cmd "slurm.pl --config conf/slurm.conf" --num-nodes 2 --ngpu 4 \\
          --train-config conf/train.yaml --num-epochs 40 dump/fbank/train exp/spk_x/batches exp/spk_x
Options:
  --cmd CMD             job runner (default: ${cmd}); slurm.pl for --num-nodes > 1
  --num-nodes K         nodes, one Slurm task each (default: ${num_nodes})
  --ngpu N              GPUs per node (default: ${ngpu}: CPU)
  --nproc P             CPU processes per node when --ngpu 0 (default: ${nproc})
  --train-config FILE   training config (default: ${train_config})
  --num-epochs E        epochs (default: ${num_epochs})
  --num-utt M           utterances per speaker (default: from the batch lists)
  --valid-data DIR, --valid-feats DIR   validation set and its features
  --fbank-conf FILE, --vad-conf FILE    stage-2 options recorded in config.yaml
  --resume BOOL         continue from the checkpoint (default: ${resume})
  --resume-new-schedule BOOL   resume with a changed lr / schedule / epochs (default: ${resume_new_schedule})
  --num-threads N       torch threads per process (default: ${num_threads}: automatic)
  --rdzv-port PORT      rendezvous port for --num-nodes > 1 (default: from the job id)
  --train-opts "..."    more options for python -m spkflow.bin.train
EOF
)

. "${root}/scripts/lib/jobs.sh"   # parses the options, sets ${python}, defines log and jobs_*

[ $# -eq 3 ] || jobs_usage
train_dir=$1
batches_dir=$2
exp_dir=$3

die() { log "Error: $*"; exit 1; }
is_pos_int() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }
is_pos_int "${num_nodes}" || die "--num-nodes '${num_nodes}': want a positive integer"
is_pos_int "${nproc}" || die "--nproc '${nproc}': want a positive integer"
[[ "${ngpu}" =~ ^[0-9]+$ ]] || die "--ngpu '${ngpu}': want an integer >= 0"
case "${resume}" in true|false) ;; *) die "--resume '${resume}': want true or false" ;; esac
case "${resume_new_schedule}" in true|false) ;; *) die "--resume-new-schedule '${resume_new_schedule}': want true or false" ;; esac
[ -f "${train_dir}/feats.scp" ] || [ -f "${train_dir}/wav.scp" ] \
    || die "${train_dir}: neither feats.scp (stage 2) nor wav.scp (a data dir, for a config that trains on audio)"
[ -f "${train_config}" ] || die "training config ${train_config} not found"
for _e in $(seq 1 "${num_epochs}"); do
    [ -f "${batches_dir}/epoch${_e}.txt" ] \
        || die "${batches_dir}/epoch${_e}.txt not found (run stage 3 with --num_epochs ${num_epochs})"
done
# The job runner must be able to span nodes: only a scheduler can.
read -r -a cmd_words <<< "${cmd}"
runner=$(basename "${cmd_words[0]}")
if [ "${num_nodes}" -gt 1 ] && [ "${runner}" != slurm.pl ]; then
    die "--num-nodes ${num_nodes} needs a Slurm job runner, but the runner is '${cmd}'" \
        "(${runner} runs on one machine or has no multi-node launcher): set cmd_backend=slurm in cmd.sh" \
        "(and conf/slurm.conf), or train on one node with --num-nodes 1"
fi

opts=(--config "${train_config}" --train-data "${train_dir}" --train-feats "${train_dir}"
      --batches-dir "${batches_dir}" --num-epochs "${num_epochs}" --out-dir "${exp_dir}"
      --num-threads "${num_threads}")
[ -n "${num_utt}" ] && opts+=(--num-utt "${num_utt}")
[ -n "${valid_data}" ] && opts+=(--valid-data "${valid_data}" --valid-feats "${valid_feats:-${valid_data}}")
[ -n "${fbank_conf}" ] && opts+=(--fbank-conf "${fbank_conf}")
[ -n "${vad_conf}" ] && opts+=(--vad-conf "${vad_conf}")
opts+=(--resume "${resume}" --resume-new-schedule "${resume_new_schedule}")
if [ "${ngpu}" -gt 0 ]; then
    nproc_per_node=${ngpu}; opts+=(--device cuda)
else
    nproc_per_node=${nproc}; opts+=(--device cpu)
fi
# shellcheck disable=SC2206  # train_opts is a list of words on purpose
[ -n "${train_opts}" ] && opts+=(${train_opts})

world=$((num_nodes * nproc_per_node))
runner_opts=(--gpu "${ngpu}")
if [ "${num_nodes}" -gt 1 ]; then
    runner_opts+=(--num-nodes "${num_nodes}")
    launch=("${root}/scripts/spk/torchrun_node.sh" --python "${python}" --port "${rdzv_port}"
            --nnodes "${num_nodes}" --nproc-per-node "${nproc_per_node}")
elif [ "${nproc_per_node}" -gt 1 ]; then
    launch=("${python}" -m torch.distributed.run --standalone --nproc_per_node "${nproc_per_node}")
else
    launch=("${python}")
fi

jobs_lock "${exp_dir}"   # before anything there is written (train.log included), held for the whole job
mkdir -p "${exp_dir}/log"
# One log per run: the earlier run's train.log (and rank logs) are kept with suffix .<N>.
rotated=
if [ -f "${exp_dir}/train.log" ]; then
    n=1; while [ -f "${exp_dir}/train.log.${n}" ]; do n=$((n + 1)); done
    rotated=${exp_dir}/train.log.${n}
    mv "${exp_dir}/train.log" "${rotated}"
    for f in "${exp_dir}"/log/train.rank*.log; do
        [ -f "${f}" ] && mv "${f}" "${f}.${n}"
    done
fi
if [ -f "${exp_dir}/checkpoint.pth" ] && ${resume}; then
    log "Resuming from ${exp_dir}/checkpoint.pth"
fi
log "Training on ${num_nodes} node(s) x ${nproc_per_node} process(es) (world size ${world}), log: ${exp_dir}/train.log"
# shellcheck disable=SC2086  # cmd is a command line with options
if ${cmd} "${runner_opts[@]}" "${exp_dir}/train.log" "${launch[@]}" -m spkflow.bin.train "${opts[@]}"; then
    if [ ! -f "${exp_dir}/model.pth" ]; then
        die "training stopped before epoch ${num_epochs} (${exp_dir}/checkpoint.pth kept): run the same command again to resume"
    fi
    exit 0
fi

train_log=${exp_dir}/train.log
checkpoint=${exp_dir}/checkpoint.pth
if [ ! -f "${train_log}" ]; then  # e.g. slurm.pl without a controller: nothing was submitted
    die "${runner} could not start the training job (its message is above), so ${train_log} was never written" \
        "${rotated:+(the earlier log is ${rotated}) }and no training ran: run the same command again once" \
        "${runner} can start jobs"
fi
log "Error: training failed, see ${train_log}"
# the trainer's own error (one line, spkflow.bin.train), else what looks like one
errors=$(grep -F "spkflow.bin.train: error:" "${train_log}" | awk '!seen[$0]++' | tail -n 3 || true)
if [ -n "${errors}" ]; then
    echo "${errors}" >&2
else
    grep -E "ERROR|Error|error:" "${train_log}" | tail -n 5 >&2 || tail -n 20 "${train_log}" >&2
fi
# torchrun's failure summary lists each failed worker as "rank : R (local_rank: L)" and
# "exitcode : C (pid: ...)"; name those ranks' logs.
awk '/^[[:space:]]*rank[[:space:]]*:/ { r = $3 }
     /^[[:space:]]*exitcode[[:space:]]*:/ && r != "" { print r, $3; r = "" }' "${train_log}" \
    | sort -u -k1,1n | while read -r rank code; do
        how="exit code ${code}"
        [[ "${code}" == -* ]] && how="killed by signal ${code#-}"
        log "Failed: rank ${rank} (${how}), log: ${exp_dir}/log/train.rank${rank}.log"
    done
if grep -qF "refusing to resume" "${train_log}"; then
    # spkflow/train/resume.py said what can be done; the same command would be refused the same way
    log "${exp_dir}/config.yaml and ${checkpoint} are untouched; running the same command again would be" \
        "refused the same way: do one of the things the error says"
elif [ -f "${checkpoint}" ]; then
    log "${errors:+Fix the error above; then }re-running stage 4 (spk.sh --stage 4, same options) resumes from ${checkpoint}"
else
    log "No checkpoint was written yet: running again starts from the beginning${errors:+ (once the error above is fixed)}"
fi
exit 1
