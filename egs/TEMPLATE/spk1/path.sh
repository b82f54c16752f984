# shellcheck shell=bash
# Environment for recipes: a Python environment, this checkout's spkflow and utils/ first, C collation.
#
# Python: this checkout's .venv when it has one (tools/setup.sh makes it), else the environment
# already active (a venv or conda env with spkflow's dependencies; $SPKFLOW_PYTHON is not used here).
# Library: whichever environment that is, `python -m spkflow...` imports spkflow from *this*
# checkout.  A venv made by tools/setup.sh in another checkout holds an editable install of that
# one, which would win if nothing said otherwise; PYTHONPATH puts this checkout first, and the
# check below stops with a clear message if the interpreter still finds another spkflow.
MAIN_ROOT=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../../.." && pwd -P)
if [ -f "${MAIN_ROOT}/.venv/bin/activate" ]; then
    # shellcheck disable=SC1091
    . "${MAIN_ROOT}/.venv/bin/activate"
elif ! python -c 'import torch, kaldiio' >/dev/null 2>&1; then
    echo "path.sh: ${MAIN_ROOT}/.venv not found and the active python ($(command -v python || echo none)) lacks torch/kaldiio; run: bash ${MAIN_ROOT}/tools/setup.sh" >&2
    # shellcheck disable=SC2317  # exit when run instead of sourced
    return 1 2>/dev/null || exit 1
fi
export PATH=${MAIN_ROOT}/utils:${PATH}
export PYTHONPATH=${MAIN_ROOT}${PYTHONPATH:+:${PYTHONPATH}}
export LC_ALL=C
export PYTHONIOENCODING=UTF-8
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
_spkflow_at=$(python -c 'import os, spkflow; print(os.path.dirname(os.path.realpath(spkflow.__file__)))' 2>/dev/null) || _spkflow_at=
if [ "${_spkflow_at}" != "${MAIN_ROOT}/spkflow" ]; then
    echo "path.sh: python ($(command -v python)) imports spkflow from '${_spkflow_at:-nowhere}', not from this checkout ${MAIN_ROOT}/spkflow" >&2
    unset _spkflow_at
    # shellcheck disable=SC2317  # exit when run instead of sourced
    return 1 2>/dev/null || exit 1
fi
unset _spkflow_at
