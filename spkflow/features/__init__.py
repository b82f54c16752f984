"""Stage 2: features of a data dir.

``fbank`` (Kaldi-compatible log-mel filterbank, ``compute-fbank-feats``' numbers), ``vad``
(Kaldi's energy VAD), ``jobs`` (one feature job of stage 2 and the merge: arks, scp, stamps).

May import: ``core``, ``data``.
"""
