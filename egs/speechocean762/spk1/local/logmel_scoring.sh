#!/usr/bin/env bash
# The centring of one pair against a batch, measured without a trained model: the non-learned
# log-mel embedder of local/logmel_baseline.py (mean + std of the voiced 80-bin log-mel frames,
# here computed from the audio), put through stage 6's scoring (a WCCN backend fitted on the
# training set, AS-norm against its speakers, a calibration fitted on DSPSpeech-20's trials centred
# on their own recordings), then local/calibration_study.py. RESULTS.md, "One pair".
#   ./run.sh --stage 1 --stop_stage 1 --local_data_opts "--librispeech true --fsdd true" \
#       --test_sets "test dsp20 libri fsdd"
#   local/logmel_scoring.sh [--exp exp/logmel_scoring] [--sets "test dsp20 libri fsdd"]
set -euo pipefail

exp=exp/logmel_scoring        # where the embeddings and the scoring go
sets="test dsp20 libri fsdd"  # sets embedded and studied (data/<set> with trials)
calib_set=dsp20               # the calibration's trials (as the demo's cross-corpus dsp20_8k)
cohort_size=25                # AS-norm top-N, as the demo

. ./path.sh
. utils/parse_options.sh

for s in train ${sets}; do
    [ -s "${exp}/embed/${s}/xvector.scp" ] && continue
    python - "data/${s}" "${exp}/embed/${s}" <<'EOF'
import sys
from pathlib import Path

import kaldiio
import numpy as np

from spkflow.data.audio import AudioReader
from spkflow.features.fbank import FbankOptions, compute_fbank, compute_vad, select_voiced

data, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
reader = AudioReader(data, sample_rate=16000)
with kaldiio.WriteHelper(f"ark,scp:{out}/xvector.ark,{out}/xvector.scp") as w:
    for utt in reader.keys():
        f = compute_fbank(reader.read(utt), 16000, FbankOptions())
        x = select_voiced(f.astype(np.float64), compute_vad(f))
        w(utt, np.concatenate([x.mean(axis=0), x.std(axis=0)]).astype(np.float32))
EOF
done

python - "data/train/utt2spk" "${exp}/embed/train" <<'EOF'
import sys

import kaldiio
import numpy as np

from spkflow.data.tables import read_kv

utt2spk, out = read_kv(sys.argv[1]), sys.argv[2]
emb = kaldiio.load_scp(f"{out}/xvector.scp")
spk: dict[str, list[np.ndarray]] = {}
for u, s in utt2spk.items():
    spk.setdefault(s, []).append(np.asarray(emb[u]))
with kaldiio.WriteHelper(f"ark,scp:{out}/spk_xvector.ark,{out}/spk_xvector.scp") as w:
    for s, v in spk.items():
        w(s, np.mean(v, axis=0).astype(np.float32))
EOF

mkdir -p "${exp}/backend"
python -m spkflow.bin.fit_backend --backend wccn --xvector-scp "${exp}/embed/train/xvector.scp" \
    --utt2spk data/train/utt2spk --out "${exp}/backend/wccn.npz"
python -m spkflow.bin.calibrate --trials "data/${calib_set}/trials" --xvector-scp "${exp}/embed/${calib_set}/xvector.scp" \
    --backend "${exp}/backend/wccn.npz" --cohort-scp "${exp}/embed/train/spk_xvector.scp" \
    --cohort-size "${cohort_size}" --set-name "${calib_set}" --out-dir "${exp}"
python local/calibration_study.py --exp "${exp}" --sets "${sets}"
