"""The networks and what they are trained with.

``models`` (ECAPA-TDNN, the d-vector LSTM and others, masked so that a padded batch equals each
utterance alone; built from the config's ``model`` section, names and keys checked), ``losses``
(GE2E, GE2E-XS, AAM-softmax), ``checkpoint`` (saved atomically, loaded with
``weights_only=True``).

May import: ``core``.
"""
