#!/usr/bin/env bash
# Set up everything the tests need and run them:
#   bash tools/test.sh [pytest args]
# Installs the Python environment (tools/setup.sh --test) and, when run as root, the
# Debian packages for the real Slurm and Grid Engine used by the job-runner tests
# (tools/install_schedulers.sh). The tests start and stop the schedulers themselves.
# The static checks (tools/lint.sh: ruff and shellcheck) run first; a finding fails the run.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "${root}"

bash tools/setup.sh --test
if [ "$(id -u)" = 0 ] && [ -f tools/install_schedulers.sh ]; then
    bash tools/install_schedulers.sh
fi
bash tools/lint.sh
export PATH=${root}/utils:${PATH}
export LC_ALL=C
# one worker per CPU; a file is one unit of work, test/schedulers one unit (test/conftest.py);
# `-n 0` in the arguments runs everything in this process; the 10 slowest tests are listed at the end
exec .venv/bin/python -m pytest -q -n auto --durations=10 "$@" test
