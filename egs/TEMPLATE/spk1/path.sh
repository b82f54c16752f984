# Environment for recipes: the project's virtual environment, utils/ on PATH, C collation.
MAIN_ROOT=$(cd "$(dirname "$(readlink -f "${BASH_SOURCE[0]}")")/../../.." && pwd)
if [ -f "${MAIN_ROOT}/.venv/bin/activate" ]; then
    # shellcheck disable=SC1091
    . "${MAIN_ROOT}/.venv/bin/activate"
else
    echo "path.sh: ${MAIN_ROOT}/.venv not found; run: bash ${MAIN_ROOT}/tools/setup.sh" >&2
    return 1 2>/dev/null || exit 1
fi
export PATH=${MAIN_ROOT}/utils:${PATH}
export PYTHONPATH=${MAIN_ROOT}${PYTHONPATH:+:${PYTHONPATH}}
export LC_ALL=C
export PYTHONIOENCODING=UTF-8
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
