# shellcheck shell=bash
# Job runners for the recipe's parallel stages (Kaldi/ESPnet convention).
#   train_cmd:  CPU jobs (feature extraction, batch planning, scoring)
#   cuda_cmd:   GPU jobs (training, GPU embedding extraction); give --gpu N
#   decode_cmd: CPU inference jobs (embedding extraction on CPU)
# Choose the back end with cmd_backend; extra scheduler options go in conf/{slurm,queue}.conf.
cmd_backend=${cmd_backend:-local}

if [ "${cmd_backend}" = local ]; then
    export train_cmd="run.pl"
    export cuda_cmd="run.pl"
    export decode_cmd="run.pl"
elif [ "${cmd_backend}" = sge ]; then
    export train_cmd="queue.pl --mem 2G"
    export cuda_cmd="queue.pl --mem 2G"
    export decode_cmd="queue.pl --mem 4G"
elif [ "${cmd_backend}" = slurm ]; then
    export train_cmd="slurm.pl --config conf/slurm.conf"
    export cuda_cmd="slurm.pl --config conf/slurm.conf"
    export decode_cmd="slurm.pl --config conf/slurm.conf"
else
    echo "$0: unknown cmd_backend=${cmd_backend} (local | sge | slurm)" >&2
    return 1
fi
