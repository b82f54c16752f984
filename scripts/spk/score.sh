#!/usr/bin/env bash
# Score a trials file against utterance embeddings: EER, minDCF, DET + histogram plots.
#
#   scripts/spk/score.sh [options] <trials> <xvector.scp> <out-dir>
#
# Writes <out-dir>/{scores,metrics.json,det.png,score_hist.png} (scores: utt1 utt2 score
# target|nontarget); with --cohort-scp the scores are AS-normalised (metrics.json keeps the
# plain cosine figures under "raw"); with --qmf also scores.qmf (calibrated, log-likelihood
# ratios) and metrics.json's "qmf"; with --results-md EXP also rewrites EXP/RESULTS.md.
# Callable from any directory (it finds the project through its own path, like the other stage
# scripts). A trials file needs target and non-target trials. The set's earlier outputs are
# removed first and the new ones appear only when all are written (metrics.json last), so after
# a failure nothing in <out-dir> looks current (with --results-md the set's row leaves RESULTS.md).
# One run per <out-dir>: a second run into it is refused, naming the first (scripts/lib/jobs.sh).
set -euo pipefail

root=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../.." && pwd)
. "${root}/utils/supervise.sh"  # a signal to this pid stops everything the script starts
export PATH=${root}/utils:${PATH}
export PYTHONPATH=${root}${PYTHONPATH:+:${PYTHONPATH}}
export LC_ALL=C
jobs_command="$0 $*"   # names this run as the holder of <out-dir>'s lock

cohort_scp=       # cohort embeddings (e.g. <exp>/embed/<train_set>/spk_xvector.scp): enables AS-norm
cohort_size=200   # top-K cohort entries for AS-norm
mean_scp=         # embeddings whose mean is subtracted before scoring (centring), e.g. the cohort
backend=          # fitted linear backend (.npz, python -m spkflow.bin.fit_backend) applied to the embeddings first
scoring_dir=      # a model dir whose scoring (scoring.yaml + .npz: backend, cohort, calibration) replaces the three above
eval_mean=false   # centre on this set's own mean (its trial utterances, no labels) instead of the training mean
qmf=              # a QMF (python -m spkflow.bin.fit_qmf): calibrated scores in <out-dir>/scores.qmf, figures in metrics.json
utt2dur=          # the set's utt2dur (for a QMF with the duration measure)
skip_missing=false  # leave out trials naming an utterance without an embedding (counted) instead of failing
model_tag=        # experiment tag recorded in metrics.json
set_name=         # name of the evaluation set (default: basename of <out-dir>)
results_md=       # experiment dir whose RESULTS.md is rewritten afterwards
results_file=     # write that summary here instead of <results_md>/RESULTS.md
python=           # python interpreter (default: utils/spkflow_python.sh: $SPKFLOW_PYTHON, python, .venv)

help_message=$(cat <<EOM
Usage: $0 [options] <trials> <xvector.scp> <out-dir>
  --cohort-scp FILE     cohort embeddings for AS-norm (default: none, plain cosine)
  --cohort-size K       top-K cohort entries (default: ${cohort_size})
  --mean-scp FILE       subtract the mean of these embeddings before scoring (default: none)
  --backend FILE        WCCN/LDA backend (.npz) applied to trial and cohort embeddings first (not with --mean-scp)
  --scoring-dir DIR     a model dir's scoring (scoring.yaml + scoring.npz): backend, cohort and calibration
                        (replaces the three options above; metrics.json then has the calibrated figures)
  --eval-mean BOOL      centre on this set's own mean instead of the training mean (default: ${eval_mean}; not with --mean-scp)
  --qmf FILE            apply this QMF (JSON): <out-dir>/scores.qmf and metrics.json's "qmf" (default: none)
  --utt2dur FILE        the set's durations, for a QMF that uses them
  --skip-missing BOOL   skip trials whose utterance has no embedding (default: ${skip_missing})
  --model-tag TAG       experiment tag for metrics.json
  --set-name NAME       set name (default: basename of <out-dir>)
  --results-md EXP_DIR  rewrite EXP_DIR/RESULTS.md from EXP_DIR/eval/*/metrics.json
  --results-file FILE   write that summary to FILE instead of EXP_DIR/RESULTS.md
EOM
)

. "${root}/scripts/lib/jobs.sh"   # parses the options, sets ${python}, defines log and jobs_*

[ $# -eq 3 ] || jobs_usage
trials=$1
xvector_scp=$2
outdir=$3

mkdir -p "${outdir}"
jobs_lock "${outdir}"   # before anything there is removed: no other run scores into ${outdir} now
# No complete-looking result of an earlier run, whatever fails below (spkflow.bin.score removes
# them too, but it may not get to start).
rm -f "${outdir}/metrics.json" "${outdir}/scores" "${outdir}/scores.qmf" "${outdir}/det.png" "${outdir}/score_hist.png"
for f in "${trials}" "${xvector_scp}" ${cohort_scp:+"${cohort_scp}"} ${mean_scp:+"${mean_scp}"} ${backend:+"${backend}"} \
        ${scoring_dir:+"${scoring_dir}/scoring.yaml"} ${qmf:+"${qmf}"} ${utt2dur:+"${utt2dur}"}; do
    [ -f "${f}" ] || { log "Error: ${f} not found"; exit 1; }
done

opts=()
[ -n "${cohort_scp}" ] && opts+=(--cohort-scp "${cohort_scp}" --cohort-size "${cohort_size}")
[ -n "${mean_scp}" ] && opts+=(--mean-scp "${mean_scp}")
[ -n "${backend}" ] && opts+=(--backend "${backend}")
[ -n "${scoring_dir}" ] && opts+=(--scoring-dir "${scoring_dir}")
[ -n "${qmf}" ] && opts+=(--qmf "${qmf}")
[ -n "${utt2dur}" ] && opts+=(--utt2dur "${utt2dur}")
opts+=(--eval-mean "${eval_mean}")
opts+=(--skip-missing "${skip_missing}")
[ -n "${model_tag}" ] && opts+=(--model-tag "${model_tag}")
[ -n "${set_name}" ] && opts+=(--set-name "${set_name}")
[ -n "${results_md}" ] && opts+=(--results-md "${results_md}")
[ -n "${results_file}" ] && opts+=(--results-file "${results_file}")

own_mean=
[ "${eval_mean}" = true ] && own_mean=" (centred on the set)"
mkdir -p "${outdir}/log"
log "Scoring ${trials} with ${xvector_scp}${scoring_dir:+ (the scoring of ${scoring_dir})}${backend:+ (backend ${backend})}${cohort_scp:+ (AS-norm, cohort ${cohort_scp})}${mean_scp:+ (centred on ${mean_scp})}${own_mean}${qmf:+ (QMF ${qmf})} -> ${outdir} (log: ${outdir}/log/score.log)"
if ! "${python}" -m spkflow.bin.score --trials "${trials}" --xvector-scp "${xvector_scp}" \
        --outdir "${outdir}" "${opts[@]}" > "${outdir}/log/score.log" 2>&1; then
    tail -n 5 "${outdir}/log/score.log" >&2
    log "Error: scoring failed, see ${outdir}/log/score.log"
    exit 1
fi
grep -E "EER|skipped|calibrated" "${outdir}/log/score.log" | tail -n 3 || true
