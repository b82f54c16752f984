"""Stage 2: features of a data dir.

``fbank`` (Kaldi-compatible log-mel filterbank, ``compute-fbank-feats``' numbers), ``vad``
(Kaldi's energy VAD), ``torch_fbank`` (both, and the model's frontend, batched in torch on any
device: the GPU path of stages 4 and 5), ``jobs`` (one feature job of stage 2 and the merge:
arks, scp, stamps).

May import: ``core``, ``data``.
"""
