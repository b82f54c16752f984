#!/usr/bin/env bash
# Command-line option parsing for recipe scripts (Kaldi-compatible).
#
# Source it after declaring every option with its default:
#
#     nj=4; cmd=run.pl; use_gpu=false
#     help_message="Usage: $0 [options] <data-dir>"
#     . utils/parse_options.sh
#
# Accepted forms (dashes and underscores in the name are the same):
#     --nj 8    --nj=8    --use-gpu true    --use_gpu=true
#     --config FILE   (sourced before the command line is applied, so the
#                      command line wins; several may be given, left to right)
#     --help | -h     (prints $help_message to stderr, exits 0)
#     --              (ends the options; the rest are positional arguments)
# Parsing stops at the first argument not starting with "--"; the remaining
# arguments are left in "$@".  An undeclared option, a missing value, or a
# non-boolean value for an option whose default is true/false is an error
# (exit 1).  Works under `set -euo pipefail` and keeps values verbatim (quotes,
# spaces, `$` and backslashes are not re-evaluated, unlike Kaldi's `eval`).

# --config files first (lower priority than the command line), in order.
__po_i=1
while [ "${__po_i}" -le $# ]; do
    __po_arg=${!__po_i}
    case "${__po_arg}" in
        --config=*)
            __po_cfg=${__po_arg#--config=}
            __po_i=$((__po_i + 1)) ;;
        --config)
            __po_next=$((__po_i + 1))
            if [ "${__po_next}" -gt $# ]; then
                echo "$0: option --config needs a value" 1>&2; exit 1
            fi
            __po_cfg=${!__po_next}
            __po_i=$((__po_i + 2)) ;;
        --help|-h) __po_i=$((__po_i + 1)); continue ;;
        --) break ;;
        --*=*) __po_i=$((__po_i + 1)); continue ;;
        --*) __po_i=$((__po_i + 2)); continue ;;
        *) break ;;
    esac
    if [ ! -r "${__po_cfg}" ]; then
        echo "$0: missing config '${__po_cfg}'" 1>&2; exit 1
    fi
    # shellcheck disable=SC2034  # for the sourcing script: the config file it was given
    config=${__po_cfg}
    # shellcheck disable=SC1090
    . "${__po_cfg}"
done

# The command line.
while [ $# -gt 0 ]; do
    case "$1" in
        --help|-h)
            if [ -z "${help_message:-}" ]; then
                echo "No help found." 1>&2
            else
                printf '%b\n' "${help_message}" 1>&2
            fi
            exit 0 ;;
        --)
            shift; break ;;
        --*=*)
            __po_opt=${1%%=*}
            __po_val=${1#*=}
            __po_nshift=1 ;;
        --*)
            __po_opt=$1
            if [ $# -lt 2 ]; then
                echo "$0: option $1 needs a value" 1>&2; exit 1
            fi
            __po_val=$2
            __po_nshift=2 ;;
        *) break ;;
    esac
    __po_name=${__po_opt#--}
    __po_name=${__po_name//-/_}
    if ! [[ "${__po_name}" =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then
        echo "$0: invalid option ${__po_opt}" 1>&2; exit 1
    fi
    if [ "${__po_name}" != config ] && [ -z "${!__po_name+xxx}" ]; then
        echo "$0: invalid option ${__po_opt}" 1>&2; exit 1
    fi
    __po_old=${!__po_name:-}
    if [ "${__po_old}" = true ] || [ "${__po_old}" = false ]; then
        if [ "${__po_val}" != true ] && [ "${__po_val}" != false ]; then
            echo "$0: expected \"true\" or \"false\": ${__po_opt} ${__po_val}" 1>&2; exit 1
        fi
    fi
    printf -v "${__po_name}" '%s' "${__po_val}"
    shift "${__po_nshift}"
done

# An empty --cmd is almost always a scripting error.
if [ -n "${cmd+xxx}" ] && [ -z "${cmd}" ]; then
    echo "$0: empty argument to --cmd option" 1>&2; exit 1
fi

unset __po_i __po_arg __po_cfg __po_next __po_opt __po_val __po_nshift __po_name __po_old
true
