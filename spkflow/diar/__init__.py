"""Diarization of long recordings: who spoke when, from windowed speaker embeddings.

``rttm`` (RTTM and UEM files read and written, errors by file, line and field), ``regions``
(time intervals: union, intersection, gaps), ``recordings`` (recording-level data dirs:
``wav.scp`` of recordings, ``rttm``, ``uem``, ``reco2dur``, validated together), ``speech``
(speech regions: oracle from a reference, the project's energy VAD, silero-vad), ``windows``
(sliding sub-segments as a Kaldi data dir with ``segments``; labelled windows back to turns),
``cluster`` (spectral clustering with auto-tuned refinement, agglomerative clustering stopped at
the calibrated LLR, resegmentation), ``pipeline`` (one recording's embeddings to turns),
``metrics`` (DER in three conditions, JER, speaker-count error with ``pyannote.metrics``),
``plots`` (reference against hypothesis).  The simulated conversations the recipes and tests
diarize are made by :mod:`spkflow.sim` (tooling, not the library).

May import: ``core``, ``data``, ``features``, ``score``.
"""
