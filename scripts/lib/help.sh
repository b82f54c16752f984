# shellcheck shell=bash
# options_help SCRIPT USAGE: a --help text made from SCRIPT's own option declarations, so that the
# help never drifts from the defaults (ESPnet writes its help by hand and it does drift).
#
# SCRIPT declares its options ESPnet style, between a "# <Something> options." heading and the
# line "help_message=...":
#     # General options.
#     nj=4                  # parallel jobs
#                           # (a comment line below continues the description)
# which gives, under the heading, "  --nj  parallel jobs (default: 4)".
options_help() {
    local script=$1 usage=$2
    printf '%s\n' "${usage}"
    awk '
        /^help_message=/ { exit }
        /^# [A-Za-z0-9 ()-]+ options/ { on = 1; flush(); sub(/^# /, ""); sub(/\.$/, ""); printf "\n%s:\n", $0; next }
        !on { next }
        /^[a-z][a-z0-9_]*=/ {
            flush()
            name = $0; sub(/=.*/, "", name)
            rest = substr($0, length(name) + 2)
            if (substr(rest, 1, 1) == "\"") { value = substr(rest, 2); sub(/".*/, "", value); sub(/^"[^"]*"/, "", rest) }
            else { value = rest; sub(/[ \t].*/, "", value); sub(/^[^ \t]*/, "", rest) }
            desc = rest; sub(/^[ \t]*#[ \t]*/, "", desc)
            if (rest !~ /#/) desc = ""
            pending = 1; next
        }
        pending && /^[ \t]+#/ { line = $0; sub(/^[ \t]+#[ \t]*/, "", line); desc = desc " " line; next }
        { flush() }
        function flush() {
            if (!pending) return
            if (desc ~ /\(default: /) printf "  --%-22s %s\n", name, desc
            else printf "  --%-22s %s (default: %s)\n", name, desc, (value == "" ? "empty" : value)
            pending = 0
        }
        END { flush() }
    ' "${script}"
}
