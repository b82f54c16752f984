#!/usr/bin/env bash
# Ablation of the waveform augmentation: each stage of conf/tuning/train_aug.yaml switched off in turn,
# over several seeds, next to the default demo config, as one Markdown table.
#
#   local/ablate_aug.sh [--seeds "0 1"] [--variants "all no_speed ..."] [--base conf/tuning/train_aug.yaml]
#                       [--with_default true] [run.sh options, e.g. --num_epochs 28]
#
# Needs stages 1-2 and local/prepare_aug.sh. Writes one config per variant to
# exp/ablate_aug/conf/train_aug_<variant>.yaml (all: the base; none: raw audio, no augmentation;
# no_<stage>: that stage off) and runs local/compare_losses.sh on them (and on conf/train.yaml
# with --with_default true): a run whose metrics exist is not repeated; the table goes to
# exp/compare_losses.md and exp/ablate_aug.md. Choose settings on speechocean762 test and
# DSPSpeech-20 only (issue 11); held-out sets are reported, never used to choose.
set -euo pipefail

log() { echo "$(date '+%Y-%m-%dT%H:%M:%S') (${0##*/}) $*"; }

seeds="0 1"                                                       # training seeds (and batch seeds)
variants="all none no_speed no_reverb no_noise no_band no_gain"   # which configs to make
base=conf/tuning/train_aug.yaml                                          # the augmented config to ablate
with_default=true                                                 # also run conf/train.yaml (ark path)
run_opts=()
while [ $# -gt 0 ]; do
    case "$1" in
        --seeds) seeds=$2; shift 2 ;;
        --variants) variants=$2; shift 2 ;;
        --base) base=$2; shift 2 ;;
        --with_default) with_default=$2; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) run_opts+=("$1"); shift ;;
    esac
done
case ${with_default} in true | false) ;; *) echo "--with_default true|false" >&2; exit 1 ;; esac
[ -f "${base}" ] || { log "Error: ${base} not found"; exit 1; }

. ./path.sh
confdir=exp/ablate_aug/conf
mkdir -p "${confdir}"
configs=()
for v in ${variants}; do
    out=${confdir}/train_aug_${v}.yaml
    python - "${base}" "${v}" "${out}" <<'PY'
import sys

import yaml

from spkflow.train.config import normalize_train_config

base, variant, out = sys.argv[1:]
cfg = yaml.safe_load(open(base, encoding="utf-8"))
aug = cfg.setdefault("augment", {})
if variant == "none":
    cfg.pop("augment")
elif variant.startswith("no_"):
    stage = variant[3:]
    if stage not in aug:
        sys.exit(f"{base}: no augment.{stage} to switch off (variant {variant})")
    if stage == "speed":
        aug[stage]["factors"] = None
    else:
        aug[stage]["prob"] = 0.0
elif variant != "all":
    sys.exit(f"unknown variant {variant!r}: all | none | no_<stage>")
normalize_train_config(cfg, out)  # fail here, not in stage 4
with open(out, "w", encoding="utf-8") as f:
    f.write(f"# {variant} of {base} (local/ablate_aug.sh)\n")
    yaml.safe_dump(cfg, f, sort_keys=False)
PY
    configs+=("${out}")
done
${with_default} && configs+=(conf/train.yaml)
log "configs: ${configs[*]}; seeds: ${seeds}"
local/compare_losses.sh --seeds "${seeds}" --configs "${configs[*]}" "${run_opts[@]}"
cp exp/compare_losses.md exp/ablate_aug.md
log "Successfully finished: exp/ablate_aug.md"
