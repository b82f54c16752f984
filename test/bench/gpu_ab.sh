#!/usr/bin/env bash
# Before and after on one GPU loan: bench_gpu.py's extraction and training figures from an earlier
# commit's code and from the working tree, interleaved (before, after, before, after), so that a
# change to a GPU path is measured against its predecessor on the same machine in the same hour.
#
#   bash test/bench/gpu_ab.sh prepare REV   # here, with git: REV's code into ${GPU_BUNDLE}/before
#   bash test/bench/gpu_ab.sh run OUT_DIR   # on the GPU machine (the bundle carried beside the code)
#
# prepare: `git archive REV` of what bench_gpu.py runs (spkflow/, test/bench/, test/helpers/, the
#          VoxCeleb recipe's conf/) into ${GPU_BUNDLE}/before (about 2.5 MB; gpu_bundle.sh's wheels,
#          corpora and rooms must be there too: the device tool carries .gpu/ with the working tree).
# run:     installs the bundle's wheels (--no-index) into a temporary folder, then runs bench_gpu.py,
#          logging at INFO (the jobs' waits and page-locked slots), twice each way:
#            extraction: bfloat16, batch 256, fbank on the GPU, ${AB_UTTS} clips of 6 s WAV;
#            training:   the three loader paths, ${AB_STEPS} steps after as many of warm-up.
#          OUT_DIR/{before,after}_{x,t}{1,2}.{json,log}; one summary line per run on stdout.
# Environment: GPU_BUNDLE (default .gpu), AB_DEVICE (cuda; cpu for a rehearsal), AB_UTTS (48000),
# AB_STEPS (60), AB_PARTS ("extraction train"), AB_ARGS (more bench_gpu.py options, e.g.
# "--channels 16" for a rehearsal), PYTHON (python3), AB_NO_WHEELS=1 (the interpreter's own packages).
# A rehearsal on the CPU (a minute on 2 cores):
#   AB_DEVICE=cpu AB_UTTS=64 AB_PARTS=extraction AB_ARGS="--channels 16" AB_NO_WHEELS=1 \
#   PYTHON=$PWD/.venv/bin/python bash test/bench/gpu_ab.sh run /tmp/ab
set -euo pipefail

bundle=${GPU_BUNDLE:-.gpu}
device=${AB_DEVICE:-cuda}
utts=${AB_UTTS:-48000}
steps=${AB_STEPS:-60}
python=${PYTHON:-python3}
parts=${AB_PARTS:-extraction train}
read -r -a extra <<< "${AB_ARGS:-}"

usage() { echo "Usage: $0 prepare REV | run OUT_DIR" >&2; exit 1; }
[ $# -eq 2 ] || usage
root=$(pwd)

case "$1" in
    prepare)
        rev=$(git rev-parse --verify "$2^{commit}")
        rm -rf "${bundle}/before"
        mkdir -p "${bundle}/before"
        git archive "${rev}" spkflow test/bench test/helpers egs/voxceleb/spk1/conf | tar -x -C "${bundle}/before"
        echo "${rev}" > "${bundle}/before/REV"
        echo "gpu_ab.sh: ${rev} in ${bundle}/before ($(du -sh "${bundle}/before" | cut -f1))"
        ;;
    run)
        out=$2
        [ -f "${bundle}/before/REV" ] || { echo "gpu_ab.sh: no ${bundle}/before: run '$0 prepare REV' first" >&2; exit 1; }
        mkdir -p "${out}"
        out=$(cd "${out}" && pwd)
        bundle=$(cd "${bundle}" && pwd)
        site=$(mktemp -d)
        if [ -z "${AB_NO_WHEELS:-}" ]; then
            "${python}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "${site}" \
                "${bundle}"/wheels/*.whl
        fi
        corpora=${bundle}/corpora
        export SPEECHOCEAN762=${corpora}/speechocean762 LIBRISPEECH=${corpora}/librispeech_mini
        export DSPSPEECH20=${corpora}/dspspeech20 FSDD=${corpora}/fsdd
        rirs=${bundle}/rirs
        bench() {  # bench NAME CODE_ROOT PART [bench_gpu.py options]
            local name=$1 code=$2 part=$3
            shift 3
            local rc=0
            (cd "${code}" && PYTHONPATH="${code}:${site}" "${python}" -c '
import logging, runpy, sys
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
sys.argv = ["bench_gpu.py"] + sys.argv[1:]
runpy.run_path("test/bench/bench_gpu.py", run_name="__main__")
' --device "${device}" --parts "${part}" --dtypes bfloat16 --batch-sizes 256 --fbank-on device \
                --extract-format wav --rirs "${rirs}" --workdir "/tmp/gpu_ab_${name}" \
                --json "${out}/${name}.json" "$@" "${extra[@]}") > "${out}/${name}.log" 2>&1 || rc=$?
            echo "${name} (rc ${rc}): $(grep -E '^  (extraction|training) ' "${out}/${name}.log" | tr -s ' ' | tr '\n' ';')"
        }
        echo "gpu_ab.sh: before = $(cat "${bundle}/before/REV"), after = the working tree"
        for part in ${parts}; do
            case "${part}" in
                extraction) tag=x opts=(--num-utts "${utts}") ;;
                train) tag=t opts=(--train-paths "ark,raw,raw-device" --train-steps "${steps}" --train-warmup "${steps}") ;;
                *) echo "gpu_ab.sh: AB_PARTS takes extraction and train, not ${part}" >&2; exit 1 ;;
            esac
            for r in 1 2; do
                bench "before_${tag}${r}" "${bundle}/before" "${part}" "${opts[@]}"
                bench "after_${tag}${r}" "${root}" "${part}" "${opts[@]}"
            done
        done
        grep -h -E "page-locked|waited for batches" "${out}"/after_x1.log 2>/dev/null | head -4 || true
        ;;
    *) usage ;;
esac
