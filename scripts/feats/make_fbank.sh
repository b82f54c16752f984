#!/usr/bin/env bash
# Kaldi-compatible log-mel filterbank features + energy VAD for a data dir, in parallel jobs.
#
#   scripts/feats/make_fbank.sh [--cmd run.pl] [--nj 4] [--fbank-conf conf/fbank.conf] \
#       [--vad-conf conf/vad.conf] [--compress false] [--skip-bad false] DATA_DIR OUT_DIR
#
# Copies DATA_DIR to OUT_DIR and writes there (LC_ALL=C order, like the data dir):
#   feats.scp            fbank matrices (float32, or Kaldi-compressed with --compress true)
#   vad.scp              energy VAD per frame (1.0 voiced / 0.0), as Kaldi's compute-vad
#   cmvn_utt.scp         per-utterance CMVN stats (compute-cmvn-stats format), all frames
#   cmvn_utt_voiced.scp  the same over voiced frames (what the loader's mean normalisation uses)
#   utt2num_frames
#   bad_utts             with --skip-bad true: utterances left out, "utt<TAB>reason"
# arks under OUT_DIR/data/, one log per job under OUT_DIR/log/.  Jobs get consecutive runs of
# utterances of about equal audio duration (utt2dur when present).  The merge step fails,
# naming them, when utterances are neither in feats.scp nor in bad_utts.  A failed job fails
# the script, naming its log and the utterance.  feats.scp is written last and atomically and
# stale outputs are removed first, so an interrupted run never leaves a complete-looking
# feats.scp.  Audio at another rate is resampled to --sample-frequency of the fbank config.
# One run per OUT_DIR: a second one is refused naming the first (host, pid, command, start);
# the merge checks that every job used this run's fbank/VAD options, and writes feats.scp,
# vad.scp, cmvn_utt*.scp, utt2num_frames and bad_utts all together or none (a full disk too).
# The data dir is checked first (sorted unique keys, utt2spk/spk2utt agreement, UTF-8 keys).
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
fbank_conf=         # Kaldi-style fbank options (empty: built-in defaults, 80 bins 25/10 ms 16 kHz, dither 0)
vad_conf=           # Kaldi-style compute-vad options (empty: built-in defaults)
compress=false      # Kaldi-compress the feature matrices (see --compression-method)
compression_method=3  # with --compress true: 3 = two bytes per value, half the size, error ~3e-4
                      # (fast crops); 1 = Kaldi's default 1-byte code, a quarter, ~1% error
skip_bad=false      # leave unreadable / too short utterances out (listed in OUT_DIR/bad_utts)
python=             # python interpreter (default: utils/spkflow_python.sh: $SPKFLOW_PYTHON, python, .venv)

help_message=$(cat <<EOF
Usage: $0 [options] <data-dir> <out-dir>
  e.g. $0 --nj 8 --fbank-conf conf/fbank.conf data/train dump/fbank/train
Options:
  --cmd CMD           job runner (default: ${cmd})
  --nj N              parallel jobs (default: ${nj})
  --fbank-conf FILE   fbank options, one --name=value per line
  --vad-conf FILE     energy VAD options, one --name=value per line
  --compress BOOL     Kaldi-compress the feature matrices (default: ${compress})
  --compression-method N  Kaldi CompressionMethod with --compress true: 3 two-byte (default),
                      1 Kaldi's automatic 1-byte per-column code
  --skip-bad BOOL     leave bad utterances out instead of failing (default: ${skip_bad})
EOF
)

. "${root}/scripts/lib/jobs.sh"   # parses the options, sets ${python}, defines log and jobs_*
[ $# -eq 2 ] || jobs_usage
data=$1
out=$2

for f in wav.scp utt2spk; do
    if [ ! -s "${data}/${f}" ]; then
        log "Error: ${data}/${f} does not exist or is empty"
        exit 1
    fi
done
for c in "${fbank_conf}" "${vad_conf}"; do
    if [ -n "${c}" ] && [ ! -f "${c}" ]; then
        log "Error: config file ${c} does not exist"
        exit 1
    fi
done
if ! [[ "${nj}" =~ ^[0-9]+$ ]] || [ "${nj}" -lt 1 ]; then
    log "Error: --nj must be a positive integer, got '${nj}'"
    exit 1
fi
mkdir -p "${out}/log" "${out}/data"
if [ "$(cd "${data}" && pwd -P)" = "$(cd "${out}" && pwd -P)" ]; then
    log "Error: <out-dir> must differ from <data-dir> (the data dir is copied there)"
    exit 1
fi
abs() { [ -z "$1" ] && return 0; echo "$(cd "$(dirname "$1")" && pwd -P)/$(basename "$1")"; }
fbank_conf=$(abs "${fbank_conf}")
vad_conf=$(abs "${vad_conf}")
name=$(basename "$(cd "${data}" && pwd -P)")
feat_opts=(${fbank_conf:+--fbank-conf "${fbank_conf}"} ${vad_conf:+--vad-conf "${vad_conf}"}
           --compress "${compress}" --compression-method "${compression_method}")
jobs_lock "${out}"
# The data dir is checked before anything is written: non-UTF-8 keys, utt2spk/spk2utt agreement.
if ! "${python}" -m spkflow.bin.datadir validate --no-feats --no-text --no-wav --name make_fbank.sh "${data}"; then
    log "Error: ${data} is not a valid data dir (see above; utils/fix_data_dir.sh fixes sorting and agreement)"
    exit 1
fi

# Stale outputs first: from here on, no complete-looking feats.scp until the merge succeeds.
rm -f "${out}"/{feats.scp,vad.scp,cmvn_utt.scp,cmvn_utt_voiced.scp,utt2num_frames,bad_utts}
rm -f "${out}/data/"*"_${name}."*.scp
for f in "${data}"/*; do
    [ -f "${f}" ] || continue
    case $(basename "${f}") in
        feats.scp|vad.scp|cmvn.scp|cmvn_utt.scp|cmvn_utt_voiced.scp|utt2num_frames|bad_utts) ;;
        *) cp "${f}" "${out}/" ;;
    esac
done

# Recordings below the features' rate are upsampled by the jobs: say so (from headers, no decoding).
rate_opt=(--rate 16000)
[ -n "${fbank_conf}" ] && rate_opt=(--fbank-conf "${fbank_conf}")
"${python}" -m spkflow.bin.audio_rates "${rate_opt[@]}" "${data}" 2>&1 | sed 's/^.*INFO: //; s/^.*WARNING: /Warning: /' >&2 || true

num_utts=$(wc -l < "${data}/utt2spk")
nj=$(jobs_clamp_nj "${nj}" "${data}/utt2spk")
log "fbank + VAD for ${data} (${num_utts} utterances) with ${nj} jobs -> ${out}"
rm -rf "${out}/split${nj}"
"${python}" -m spkflow.bin.split_by_duration "${data}" "${nj}" "${out}/split${nj}"

if ! ${cmd} JOB=1:"${nj}" "${out}/log/make_fbank_${name}.JOB.log" \
        "${python}" -m spkflow.bin.compute_fbank "${feat_opts[@]}" --skip-bad "${skip_bad}" \
            "${data}" "${out}/split${nj}/utts.JOB" "${out}/data" "${name}" JOB; then
    jobs_report_failed "${out}/log/make_fbank_${name}"
    exit 1
fi

if ! "${python}" -m spkflow.bin.merge_fbank "${feat_opts[@]}" \
        "${data}" "${out}" "${out}/data" "${name}" "${nj}" "${out}/log"; then
    log "Error: merging the jobs of ${data} failed"
    exit 1
fi
grep -h "real-time factor" "${out}/log/make_fbank_${name}".*.log | sed 's/^/  /' >&2 || true
log "Succeeded creating filterbank features for ${name} in ${out}"
