#!/usr/bin/env bash
# What test/bench/gpu_check.sh needs on a bare GPU machine without network, gathered here into the
# ignored folder .gpu/ (it travels beside the code: the device tool's `carry`, or rsync/scp):
#
#   .gpu/wheels/    the Python packages such a machine lacks (Python 3.12, manylinux x86_64), as
#                   wheels: kaldiio, soundfile (with libsndfile inside) and cffi + pycparser, which
#                   soundfile needs, espnet without its dependencies and typeguard (spkflow's
#                   ECAPA-TDNN and ResNet build on espnet2.spk modules, which need only those),
#                   threadpoolctl (every job and DataLoader worker pins its BLAS/OpenMP pools with it);
#                   gpu_check.sh installs them with --no-index into a temporary folder
#   .gpu/corpora/   the real speech the CUDA-marked tests and bench_gpu.py read (helpers.corpora.SPEECH:
#                   speechocean762, LibriSpeech, DSPSpeech-20, FSDD; 7 MB), in each corpus's layout
#   .gpu/rirs/      simulated room impulse responses (spkflow.bin.make_rirs: pyroomacoustics, which
#                   the GPU machine lacks) for the raw training path's reverberation
#   .gpu/MANIFEST   what is there, its size, and the command that made it
#
#   bash test/bench/gpu_bundle.sh [--python-version 3.12] [--out .gpu]
#
# Not carried: what the rest of ESPnet imports (about 20 packages: librosa, hydra-core, nltk,
# pyworld, ...): the check does not run ESPnet's own models (their stage-5 adapter has no GPU-specific
# path), and imageio-ffmpeg (a 30 MB ffmpeg for VoxCeleb2's m4a pipes). The whole working tree with
# .gpu/ must stay under 64 MiB (the device tool's limit): the script prints both sizes and fails above.
set -euo pipefail

python_version=3.12     # the GPU machine's Python (wheels are chosen for it)
out=.gpu                # where the bundle goes (relative to the repository root; ignored by git)
# exact versions: those this project is tested with (pyproject.toml and what tools/setup.sh installs;
# cffi and pycparser: soundfile's)
wheels="kaldiio==2.18.1 soundfile==0.14.0 cffi==2.1.1 pycparser==3.12 espnet==202511 typeguard==4.6.1"
wheels+=" threadpoolctl==3.8.0"
num_rirs=20             # simulated rooms
max_mib=64              # the device tool's limit on what travels

while [ $# -gt 0 ]; do
    case "$1" in
        --python-version) python_version=$2; shift 2 ;;
        --out) out=$2; shift 2 ;;
        *) echo "Usage: $0 [--python-version ${python_version}] [--out ${out}]" >&2; exit 1 ;;
    esac
done

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "${root}"
. utils/spkflow_python.sh
python=${spkflow_python}
export LC_ALL=C

log() { echo "$(date '+%Y-%m-%dT%H:%M:%S') (gpu_bundle.sh) $*"; }

rm -rf "${out}.new"
mkdir -p "${out}.new/wheels"
log "Downloading wheels for Python ${python_version}, manylinux x86_64: ${wheels}"
# shellcheck disable=SC2086
"${python}" -m pip download --quiet --no-deps --only-binary=:all: --python-version "${python_version}" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    --platform any -d "${out}.new/wheels" ${wheels}

log "Copying the real speech of helpers.corpora.SPEECH (corpora from db.sh)"
PYTHONPATH=${root}/test:${PYTHONPATH} "${python}" - "${out}.new/corpora" <<'EOF'
import shutil
import sys
from pathlib import Path

from helpers.corpora import SPEECH, speech_files
from helpers.paths import db_var

out = Path(sys.argv[1])
for name in SPEECH:
    root = Path(db_var(name))
    files = speech_files(root, name)
    if not files:
        sys.exit(f"gpu_bundle.sh: no files of {name} under {root} (set {name}, see db.sh)")
    for f in files:
        dest = out / root.name / f.relative_to(root)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(f, dest)
    print(f"  {name}: {len(files)} files -> {out / root.name}")
EOF

log "Simulating ${num_rirs} room impulse responses"
"${python}" -m spkflow.bin.make_rirs --num "${num_rirs}" --seed 0 --out "${out}.new/rirs" >/dev/null

{
    echo "# made by: bash test/bench/gpu_bundle.sh --python-version ${python_version} --out ${out} ($(date -u +%FT%TZ))"
    (cd "${out}.new" && find . -type f ! -name MANIFEST | sort | xargs du -b)
} > "${out}.new/MANIFEST"
rm -rf "${out}"
mv "${out}.new" "${out}"

bundle=$(du -sb "${out}" | cut -f1)
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1)
total=$((bundle + tree))
log "${out}: $((bundle / 1024)) KiB (wheels $(du -sk "${out}/wheels" | cut -f1) KiB); working tree $((tree / 1024)) KiB;" \
    "together $((total / 1024)) KiB of the ${max_mib} MiB that may travel"
if [ "${total}" -gt $((max_mib * 1024 * 1024)) ]; then
    log "Error: more than ${max_mib} MiB would travel"
    exit 1
fi
