"""Stage 7 and beyond: a trained model taken elsewhere.

``pack`` (one zip with config, weights, frontend settings, the recipe's scoring, RESULTS.md and a
model card, checked member by member on unpacking), ``export`` (ONNX, checked against PyTorch), ``onnx`` (an
exported model run with onnxruntime behind the same interface), ``verify`` (verification and
identification of new recordings with a model: the work of ``spkflow.bin.verify`` / ``identify``).

May import: ``core``, ``data``, ``features``, ``nnet``, ``score``, ``embed``.
"""
