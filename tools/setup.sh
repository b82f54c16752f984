#!/usr/bin/env bash
# Set up spkflow on a fresh machine: a virtual environment in .venv with the pinned
# dependencies (pyproject.toml says why each pin) and spkflow installed in editable mode.
# Idempotent: a second run with an unchanged pyproject.toml does nothing.
#   bash tools/setup.sh [--test]     (--test also installs pytest, hypothesis, ruff, shellcheck)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "${root}"

extras=""
[ "${1:-}" = "--test" ] && extras="[test]"

python=${PYTHON:-python3}
if ! "${python}" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    echo "setup.sh: spkflow needs Python >= 3.11 (found $(${python} --version 2>&1)); set PYTHON=..." >&2
    exit 1
fi

stamp=.venv/.spkflow-installed${extras}
want=$(sha1sum pyproject.toml | cut -d' ' -f1)
if [ -f "${stamp}" ] && [ "$(cat "${stamp}")" = "${want}" ]; then
    echo "setup.sh: .venv is up to date"
    exit 0
fi

[ -x .venv/bin/python ] || "${python}" -m venv .venv
# pip 24.0: pip >= 25 refuses espnet's dependency ci_sdr, whose metadata declares a
# direct-URL requirement in an extra ("Distributions from PyPI cannot declare direct URL
# dependencies"); 24.0 installs it.
.venv/bin/python -m pip install --quiet --disable-pip-version-check "pip==24.0"
.venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".${extras}"
.venv/bin/python -c 'import torch, torchaudio, kaldiio, soundfile, espnet2.spk.encoder.ecapa_tdnn_encoder; print("setup.sh: torch", torch.__version__, "torchaudio", torchaudio.__version__)'
echo "${want}" > "${stamp}"
echo "setup.sh: done (activate with: . .venv/bin/activate)"
