"""Diarization of long recordings: who spoke when, from windowed speaker embeddings.

``rttm`` (RTTM and UEM files read and written, errors by file, line and field), ``regions``
(time intervals: union, intersection, gaps), ``recordings`` (recording-level data dirs:
``wav.scp`` of recordings, ``rttm``, ``uem``, ``reco2dur``, validated together), ``speech``
(speech regions: oracle from a reference, the project's energy VAD, silero-vad), ``windows``
(sliding sub-segments as a Kaldi data dir with ``segments``; labelled windows back to turns),
``cluster`` (spectral clustering with auto-tuned refinement, agglomerative clustering stopped at
the calibrated LLR, resegmentation), ``overlap`` (a second speaker in given overlap regions),
``metrics`` (DER in three conditions, JER, speaker-count error with ``pyannote.metrics``),
``plots`` (reference against hypothesis, or the hypothesis alone), ``result`` (``Diarization``:
what diarizing one recording returns, its RTTM and pyannote Annotation), ``naming`` (clusters
named by a saved enrolment), ``written`` (the marker of the files spkflow wrote in a folder).

The work itself, at three levels (the outer two call ``pipeline``, never each other, and nothing
here calls back up into ``api`` or ``bin``):

* ``pipeline``: one recording **in memory** (a waveform to windows and embeddings; window
  embeddings to turns) and the defaults every route shares (method, threshold, centring, count);
* ``recipe_stages``: the recipe's stages **over a recording dir** (``diar_windows``,
  ``diar_cluster``, ``diar_score``);
* ``file_list``: **a list of audio files** to RTTMs (``python -m spkflow.bin.diarize``,
  ``Embedder.diarize``), inputs checked first, a user's files never replaced, resumable.

The simulated conversations the recipes and tests diarize are made by :mod:`spkflow.sim`
(tooling, not the library).

May import: ``core``, ``data``, ``features``, ``score``, ``embed``, ``deploy`` (the domain of a
list of files, as ``verify`` reads it).
"""
