#!/usr/bin/env bash
# The GPU check: every GPU path of the project in one unattended run on one GPU box, with its figures;
# its parts' limits add up to 9 minutes (of a 15-minute loan; a device call may run 10), a hang included.
#
#   bash test/bench/gpu_check.sh OUT_DIR                       # on a machine with a CUDA GPU
#   GPU_CHECK_DEVICE=cpu bash test/bench/gpu_check.sh OUT_DIR  # the same code, small, on the CPU
#
# 1. Python packages the machine lacks (kaldiio, soundfile, threadpoolctl, ...): installed with --no-index from the
#    wheels of test/bench/gpu_bundle.sh (${GPU_BUNDLE}/wheels) into a temporary folder; no network.
# 2. Real speech: the db.sh variables point at ${GPU_BUNDLE}/corpora when the corpora are not here.
# 3. The CUDA-marked tests (pytest -m cuda: stage 5 on the GPU batched = alone and half precision vs
#    float32 on real speech, the torch fbank on the GPU = the numpy fbank, an AMP training step vs
#    float32, the trainer with AMP, a 1-GPU DDP step over NCCL, the API on CUDA) -> junit.xml, tests.log.
#    On the CPU the slow ones (the trainer, the API's stage-5 run) are left to the regular suite.
# 4. test/bench/bench_gpu.py: fbank parity, extraction and training throughput against the model
#    alone, GPU utilisation, the limits -> bench.log.
# 5. test/bench/bench_feed.py: the loaders alone (no model) with a worker per CPU of this box, each
#    against the per-core sum of its parts: what the CPU side can feed -> feed.log, feed_*.json.
# 6. OUT_DIR/gpu_check.json (device, fbank_max_abs_diff, extraction, train, feed, tests: passed /
#    failed, ...) and OUT_DIR/gpu_check.md; prints the tables and which part is the limit.
# Exit status 0 when the tests passed and both benchmarks ran to their end, 1 otherwise (the JSON is
# written either way, with what ran).  How to run it on a GPU machine without network: docs/gpu.md.
set -euo pipefail

device=${GPU_CHECK_DEVICE:-cuda}   # cuda: one GPU box's sizes; cpu: the rehearsal (<= 5 min on 2 cores)
bundle=${GPU_BUNDLE:-}              # gpu_bundle.sh's folder (default: .gpu in the repository root)
python=${PYTHON:-}                  # interpreter (default: .venv/bin/python when there, else python3)

if [ $# -ne 1 ]; then
    echo "Usage: [GPU_CHECK_DEVICE=cuda|cpu] [GPU_BUNDLE=.gpu] $0 OUT_DIR" >&2
    exit 1
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
mkdir -p "$1"
out=$(cd "$1" && pwd)
cd "${root}"
bundle=${bundle:-${root}/.gpu}
export LC_ALL=C PYTHONUNBUFFERED=1 GPU_CHECK_DEVICE=${device}
export PYTHONPATH=${root}${PYTHONPATH:+:${PYTHONPATH}}
if [ -z "${python}" ]; then
    if [ -x .venv/bin/python ]; then python=${root}/.venv/bin/python; else python=python3; fi
fi
start=${SECONDS}
site=
work=
trap 'rm -rf "${site}" "${work}"' EXIT
log() { echo "$(date '+%Y-%m-%dT%H:%M:%S') (gpu_check.sh, +$((SECONDS - start)) s) $*"; }

case "${device}" in
    cuda)
        tests_limit=180; bench_limit=270; feed_limit=45; markers="cuda"
        bench_opts=(--device cuda --num-utts 12000 --extract-format wav)
        # 200: the arks and the floor in a few s; one loader per path (the median of 3 would not fit in 45 s)
        feed_opts=(--extract-utts 4096 --train-batches 20 --ark-batches 200 --runs 1)
        ;;
    cpu)
        # limits against a hang only: on 2 free cores the whole check takes about 3 minutes; one torch
        # thread per process, as stage 5's jobs run (on a busy machine OpenMP threads spin and crawl)
        tests_limit=420; bench_limit=420; feed_limit=240; markers="cuda and not slow"
        export OMP_NUM_THREADS=1
        bench_opts=(--device cpu --threads 1 --utt-sec 3 --num-utts 8 --num-clips 4 --batch-sizes 4
                    --dtypes "float32,bfloat16" --channels 32 --num-workers 1 --train-steps 2 --train-warmup 1 --num-spk 4 --num-utt 2
                    --crop 50 --data-spk 8 --frontend-batch 4 --extract-format wav)
        feed_opts=(--utt-sec 3 --clips 4 --extract-utts 16 --extract-batch 4 --num-spk 4 --num-utt 2 --crop 50
                   --train-batches 2 --ark-batches 6 --part-items 4 --runs 1)
        ;;
    *) echo "GPU_CHECK_DEVICE must be cuda or cpu, got '${device}'" >&2; exit 1 ;;
esac
# GPU_CHECK_BENCH_ARGS: more bench_gpu.py options, after the defaults (the last one wins), e.g.
# "--num-utts 3000 --batch-sizes 256" for a shorter run
read -r -a extra <<< "${GPU_CHECK_BENCH_ARGS:-}"
bench_opts+=("${extra[@]}")

# --- 1. packages
if ! "${python}" -c 'import kaldiio, soundfile, yaml, scipy, tqdm, espnet2.spk, threadpoolctl' 2>/dev/null; then
    wheels=("${bundle}"/wheels/*.whl)
    if [ ! -f "${wheels[0]}" ]; then
        log "Error: ${python} lacks kaldiio/soundfile and ${bundle}/wheels has no wheels (run test/bench/gpu_bundle.sh where pip works)"
        exit 1
    fi
    site=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_site.XXXXXX")
    log "Installing ${#wheels[@]} wheels from ${bundle}/wheels into ${site} (no network)"
    "${python}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "${site}" "${wheels[@]}"
    export PYTHONPATH=${PYTHONPATH}:${site}
fi
"${python}" - "${device}" <<'EOF'
import sys

import torch

if sys.argv[1] == "cuda" and not torch.cuda.is_available():
    sys.exit("gpu_check.sh: torch sees no CUDA device (GPU_CHECK_DEVICE=cpu rehearses the check on the CPU)")
where = torch.cuda.get_device_name(0) if sys.argv[1] == "cuda" else "cpu"
print(f"gpu_check.sh: python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), {where}")
EOF

# --- 2. real speech: the bundle's copy where db.sh finds no corpus
for pair in SPEECHOCEAN762:speechocean762 LIBRISPEECH:librispeech_mini DSPSPEECH20:dspspeech20 FSDD:fsdd; do
    var=${pair%%:*}
    have=$(bash -c ". egs/TEMPLATE/spk1/db.sh; printf %s \"\${${var}}\"")
    if [ ! -d "${have}" ] && [ -d "${bundle}/corpora/${pair#*:}" ]; then
        export "${var}=${bundle}/corpora/${pair#*:}"
    fi
done
rirs=()
[ -f "${bundle}/rirs/wav.scp" ] && rirs=(--rirs "${bundle}/rirs")

# --- 3. the CUDA-marked tests
mapfile -t files < <(grep -rl --include='test_*.py' 'pytest.mark.cuda' test | sort)
log "pytest -m '${markers}' on ${device}: ${#files[@]} files (at most ${tests_limit} s)"
tests_rc=0
# a test running past 120 s leaves every thread's stack in tests.log (pytest's faulthandler), so a
# hang names its place before the timeout stops the run
timeout -k 10 "${tests_limit}" "${python}" -m pytest -q -ra -p no:cacheprovider -m "${markers}" \
    -o faulthandler_timeout=120 --junitxml "${out}/junit.xml" "${files[@]}" > "${out}/tests.log" 2>&1 || tests_rc=$?
if [ "${tests_rc}" = 124 ]; then
    grep -A 12 '^Timeout (' "${out}/tests.log" || true  # the innermost frames of each stack dumped
    tail -n 15 "${out}/tests.log"
    log "Error: the tests ran past ${tests_limit} s and were stopped (the stacks above: ${out}/tests.log)"
else
    tail -n 15 "${out}/tests.log"
fi

# --- 4. the benchmark
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check_work.XXXXXX")
log "bench_gpu.py ${bench_opts[*]} (at most ${bench_limit} s)"
bench_rc=0
timeout -k 10 "${bench_limit}" "${python}" test/bench/bench_gpu.py "${bench_opts[@]}" "${rirs[@]}" \
    --tests-junit "${out}/junit.xml" --workdir "${work}" --json "${out}/gpu_check.json" \
    --markdown "${out}/gpu_check.md" > "${out}/bench.log" 2>&1 || bench_rc=$?
grep -E '^  (extraction|training) ' "${out}/bench.log" || true
[ "${bench_rc}" = 0 ] || { log "Error: bench_gpu.py exited ${bench_rc} (124: past ${bench_limit} s); bench.log:"; tail -n 20 "${out}/bench.log"; }

# --- 5. the loaders alone on this box's CPUs (bench_feed.py: no model, a worker per CPU), extraction from
# WAV as above, training from FLAC as above; what a figure of 4. owes to the CPU side
feed_rc=0
rm -f "${out}"/feed_*.json "${out}/feed.log"  # a rerun into the same OUT_DIR reports its own runs only
[ -f "${work}/rirs/wav.scp" ] && [ ${#rirs[@]} = 0 ] && rirs=(--rirs "${work}/rirs")  # bench_gpu.py's rooms
for part in extract:wav train:flac; do
    log "bench_feed.py --paths ${part%%:*} --audio-format ${part#*:} ${feed_opts[*]} (at most ${feed_limit} s)"
    timeout -k 10 "${feed_limit}" "${python}" test/bench/bench_feed.py --paths "${part%%:*}" \
        --audio-format "${part#*:}" "${feed_opts[@]}" "${rirs[@]}" --workdir "${work}/feed" \
        --json "${out}/feed_${part%%:*}.json" >> "${out}/feed.log" 2>&1 || feed_rc=$?
done
grep -E '^  (extract|train)_' "${out}/feed.log" | cut -c1-160 || true
[ "${feed_rc}" = 0 ] || { log "Error: bench_feed.py exited ${feed_rc} (124: past ${feed_limit} s); feed.log:"; tail -n 20 "${out}/feed.log"; }

# --- 6. the report (also when a part failed: what ran is kept)
"${python}" - "${out}" "${device}" "${tests_rc}" "${bench_rc}" "${feed_rc}" "$((SECONDS - start))" <<'EOF'
import json
import sys
from pathlib import Path

sys.path.insert(0, "test/bench")
import bench_gpu

out, device, tests_rc, bench_rc, feed_rc, seconds = Path(sys.argv[1]), sys.argv[2], *map(int, sys.argv[3:])
path = out / "gpu_check.json"
result = json.loads(path.read_text()) if path.is_file() else {}
if "machine" not in result:
    result["machine"] = bench_gpu.machine_info(device)
    result["device"] = result["machine"]["device"]
result["tests"] = bench_gpu.junit_counts(out / "junit.xml") or {
    "passed": 0, "failed": 1, "skipped": 0, "failures": [f"pytest exited {tests_rc} without a report"],
}  # fmt: skip
result["feed"] = bench_gpu.feed_rows([out / "feed_extract.json", out / "feed_train.json"])
result["check"] = {
    "device": device, "tests_exit": tests_rc, "bench_exit": bench_rc, "feed_exit": feed_rc, "seconds": seconds,
}  # fmt: skip
result.setdefault("fbank_max_abs_diff", None)
result["limits"] = bench_gpu.limits(result)
path.write_text(json.dumps(result, indent=1) + "\n")
(out / "gpu_check.md").write_text(bench_gpu.markdown(result))
print(bench_gpu.markdown(result))
EOF
log "Wrote ${out}/gpu_check.json and gpu_check.md (tests exit ${tests_rc}, bench exit ${bench_rc}, feed exit ${feed_rc})"
[ "${tests_rc}" = 0 ] && [ "${bench_rc}" = 0 ] && [ "${feed_rc}" = 0 ]
