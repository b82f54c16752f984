#!/usr/bin/env bash
# Pack a training set's features into shards read front to back (training from slow storage).
#
#   scripts/feats/make_shards.sh [--cmd run.pl] [--nj 4] [--shard-utts 1000] [--run 8] [--audio false] \
#       [--voiced true] FEATS_DIR SHARD_DIR
#
# FEATS_DIR is stage 2's output for the set (scripts/feats/make_fbank.sh: feats.scp, vad.scp,
# cmvn_utt*.scp, utt2spk); with --audio true a data dir, whose audio files (wav.scp) the shards
# hold as stored (a pipe's output as wav), for training on audio.  Writes SHARD_DIR/shard.<K>.tar
# (per utterance: speaker, the feature record as stored in the ark, float or compressed, its VAD
# and CMVN stats; with --voiced true, the default, only the rows its VAD keeps, each as stored, and
# the voiced frames' stats: the frames a training crop with the VAD can take; or the audio file;
# spkflow/data/shards.py),
# SHARD_DIR/utt2shard and, last, SHARD_DIR/shards.list.  Each shard is written atomically by one of
# nj jobs; a rerun writes only the shards that are missing or damaged (a killed run resumes: every
# kept shard is read back and each member checked against its crc32, a damaged or cut shard named,
# shard and member, and written again), and a changed feature set or option removes the old shards
# first.  One run per SHARD_DIR (its lock).
set -euo pipefail
jobs_command="$0 $*"

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
. "${root}/utils/supervise.sh"  # a signal to this pid stops everything the script starts
export PATH=${root}/utils:${PATH}
export PYTHONPATH=${root}${PYTHONPATH:+:${PYTHONPATH}}
export LC_ALL=C
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

cmd=run.pl          # job runner: run.pl | queue.pl ... | slurm.pl ...
nj=4                # number of parallel jobs
shard_utts=1000     # utterances per shard (about: a speaker's run is not split)
run=8               # utterances of one speaker kept together in a shard
seed=0              # seed of the utterance order
audio=false         # true: shards of the audio files (wav.scp) instead of the features
voiced=true         # features: only the frames the VAD keeps (false: every frame, for frontend.vad false)
python=             # python interpreter (default: utils/spkflow_python.sh)

help_message=$(cat <<HELP
Usage: $0 [options] <feats-dir> <shard-dir>
  e.g. $0 --nj 4 dump/fbank/train dump/fbank/train/shards
Options:
  --cmd CMD           job runner (default: ${cmd})
  --nj N              parallel jobs (default: ${nj})
  --shard-utts N      utterances per shard (default: ${shard_utts})
  --run N             utterances of one speaker kept together (default: ${run})
  --seed N            seed of the order (default: ${seed})
  --audio BOOL        shards of the audio files instead of the features (default: ${audio})
  --voiced BOOL       features: only the frames the VAD keeps (default: ${voiced})
HELP
)

. "${root}/scripts/lib/jobs.sh"   # parses the options, sets ${python}, defines log and jobs_*
[ $# -eq 2 ] || jobs_usage
feats=$1
out=$2
if ! [[ "${nj}" =~ ^[1-9][0-9]*$ ]]; then
    log "Error: --nj must be a positive integer, got '${nj}'"
    echo "${help_message}" | head -n 1 >&2
    exit 1
fi
for _b in audio voiced; do
    case "${!_b}" in true|false) ;; *) log "Error: --${_b} must be true or false, got '${!_b}'"; exit 1 ;; esac
done
if ${audio}; then
    [ -s "${feats}/wav.scp" ] || { log "Error: ${feats}/wav.scp not found (a data dir)"; exit 1; }
else
    [ -s "${feats}/feats.scp" ] || { log "Error: ${feats}/feats.scp not found (run stage 2 first)"; exit 1; }
fi
mkdir -p "${out}/log"
jobs_lock "${out}"
rm -f "${out}/shards.list"   # complete again only once the merge has checked every shard
"${python}" -m spkflow.bin.make_shards prepare --shard-utts "${shard_utts}" --run "${run}" --seed "${seed}" \
    --audio "${audio}" --voiced "${voiced}" "${feats}" "${out}"
num_shards=$(wc -l < "${out}/plan")
[ "${nj}" -gt "${num_shards}" ] && nj=${num_shards}
log "shards of ${feats} with ${nj} jobs -> ${out}"
if ! ${cmd} JOB=1:"${nj}" "${out}/log/make_shards.JOB.log" \
        "${python}" -m spkflow.bin.make_shards job --audio "${audio}" "${feats}" "${out}" JOB "${nj}"; then
    jobs_report_failed "${out}/log/make_shards"
    exit 1
fi
# a shard kept from an earlier run was read back and checked (crc32 of every member); one that
# failed was written again: say which, and why
for _j in $(seq 1 "${nj}"); do
    grep -h ": writing it again$" "${out}/log/make_shards.${_j}.log" >&2 || true
done
if ! "${python}" -m spkflow.bin.make_shards merge "${out}" "${nj}"; then
    log "Error: the shards of ${feats} are incomplete (see above); rerun to write the missing ones"
    exit 1
fi
log "Succeeded writing $(wc -l < "${out}/shards.list") shards ($(du -sh "${out}" | cut -f1)) in ${out}"
