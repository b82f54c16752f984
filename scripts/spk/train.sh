#!/usr/bin/env bash
# Stage 4 launcher: train a speaker embedder on one process, on P processes of one machine, or
# on K nodes x P processes of a Slurm job, always through torch's own launcher (torchrun).
#
#   scripts/spk/train.sh [--cmd run.pl] [--num-nodes 1] [--ngpu 0] [--nproc 1] \
#       [--train-config conf/train.yaml] [--num-epochs 10] [--num-utt M] \
#       [--valid-data data/test --valid-feats dump/fbank/test] [--fbank-conf F --vad-conf F] \
#       [--resume true] [--num-threads 0] [--train-opts "..."] TRAIN_DIR BATCHES_DIR EXP_DIR
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
#   * EXP_DIR/train.log is this run's log (runner header, all ranks' output: rank 0 at INFO,
#     the others' warnings and errors); the log of an earlier run is kept as train.log.<N>.
#     Under DDP every rank also logs at INFO to EXP_DIR/log/train.rank<R>.log (kept alike).
#   * Exact resume (--resume true, the default): a run continues from EXP_DIR/checkpoint.pth
#     (written every epoch and, on SIGINT/SIGTERM, mid-epoch) with the same batch sequence,
#     whatever the launch (the rank split depends on the world size K x P only).
#   * A failed or killed run exits non-zero, names train.log and the log of each rank that
#     torchrun reports failed (with its exit code or signal), and says how to resume: run
#     the same command again. A run that ends before the last epoch (e.g. --max-steps) exits 1.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
export PATH=${root}/utils:${PATH}
export PYTHONPATH=${root}${PYTHONPATH:+:${PYTHONPATH}}

log() {
    local fname=${BASH_SOURCE[1]##*/}
    echo -e "$(date '+%Y-%m-%dT%H:%M:%S') (${fname}:${BASH_LINENO[0]}:${FUNCNAME[1]}) $*" >&2
}

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
  --num-threads N       torch threads per process (default: ${num_threads}: automatic)
  --rdzv-port PORT      rendezvous port for --num-nodes > 1 (default: from the job id)
  --train-opts "..."    more options for python -m spkflow.bin.train
EOF
)

. "${root}/utils/parse_options.sh"

if [ $# -ne 3 ]; then
    echo "${help_message}" >&2
    exit 1
fi
train_dir=$1
batches_dir=$2
exp_dir=$3

die() { log "Error: $*"; exit 1; }
is_pos_int() { [[ "$1" =~ ^[1-9][0-9]*$ ]]; }
is_pos_int "${num_nodes}" || die "--num-nodes '${num_nodes}': want a positive integer"
is_pos_int "${nproc}" || die "--nproc '${nproc}': want a positive integer"
[[ "${ngpu}" =~ ^[0-9]+$ ]] || die "--ngpu '${ngpu}': want an integer >= 0"
case "${resume}" in true|false) ;; *) die "--resume '${resume}': want true or false" ;; esac
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

if [ -z "${python}" ]; then
    spkflow_python=
    # shellcheck source=utils/spkflow_python.sh
    . "${root}/utils/spkflow_python.sh"
    python=${spkflow_python}
fi

opts=(--config "${train_config}" --train-data "${train_dir}" --train-feats "${train_dir}"
      --batches-dir "${batches_dir}" --num-epochs "${num_epochs}" --out-dir "${exp_dir}"
      --num-threads "${num_threads}")
[ -n "${num_utt}" ] && opts+=(--num-utt "${num_utt}")
[ -n "${valid_data}" ] && opts+=(--valid-data "${valid_data}" --valid-feats "${valid_feats:-${valid_data}}")
[ -n "${fbank_conf}" ] && opts+=(--fbank-conf "${fbank_conf}")
[ -n "${vad_conf}" ] && opts+=(--vad-conf "${vad_conf}")
opts+=(--resume "${resume}")
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

mkdir -p "${exp_dir}/log"
# One log per run: the earlier run's train.log (and rank logs) are kept with suffix .<N>.
if [ -f "${exp_dir}/train.log" ]; then
    n=1; while [ -f "${exp_dir}/train.log.${n}" ]; do n=$((n + 1)); done
    mv "${exp_dir}/train.log" "${exp_dir}/train.log.${n}"
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

log "Error: training failed, see ${exp_dir}/train.log"
grep -E "ERROR|Error|error:" "${exp_dir}/train.log" | tail -n 5 >&2 || tail -n 20 "${exp_dir}/train.log" >&2
# torchrun's failure summary lists each failed worker as "rank : R (local_rank: L)" and
# "exitcode : C (pid: ...)"; name those ranks' logs.
awk '/^[[:space:]]*rank[[:space:]]*:/ { r = $3 }
     /^[[:space:]]*exitcode[[:space:]]*:/ && r != "" { print r, $3; r = "" }' "${exp_dir}/train.log" \
    | sort -u -k1,1n | while read -r rank code; do
        how="exit code ${code}"
        [[ "${code}" == -* ]] && how="killed by signal ${code#-}"
        log "Failed: rank ${rank} (${how}), log: ${exp_dir}/log/train.rank${rank}.log"
    done
if [ -f "${exp_dir}/checkpoint.pth" ]; then
    log "Run the same command again (spk.sh: --stage 4) to resume from ${exp_dir}/checkpoint.pth"
else
    log "No checkpoint was written yet: running again starts from the beginning"
fi
exit 1
