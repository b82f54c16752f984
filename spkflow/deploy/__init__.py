"""Stage 7 and beyond: a trained model taken elsewhere.

``pack`` (one zip with config, weights, frontend settings, the recipe's scoring, RESULTS.md and a
model card; opening one is :mod:`spkflow.embed.packed`), ``export`` (ONNX, checked against PyTorch;
running one is :mod:`spkflow.embed.exported`), ``gallery`` (a saved enrolment), ``decisions``
(same-speaker decisions and identities of new recordings with a model, scored by its
:mod:`spkflow.score.model_scoring`: the work of ``spkflow.bin.verify`` / ``identify``).

May import: ``core``, ``data``, ``features``, ``nnet``, ``score``, ``embed``.
"""
