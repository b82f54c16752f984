"""Tooling, not the library: test data made for the diarization recipes, tests and benchmarks.

``conversations`` (single-speaker utterances laid out in time with the turn-taking statistics of
real meetings, the statistics measured from reference RTTMs and stored as JSON; the simulated
sets of ``egs/*/diar1`` and of the diarization tests).

A tooling package (:data:`spkflow.TOOLING`): only the commands (``spkflow.bin``) import it; no
library layer does, so the diarization that users run never depends on how its test data is made.

May import: ``core``, ``data``, ``features``, ``diar``.
"""
