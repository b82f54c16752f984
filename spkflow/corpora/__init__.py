"""Corpus data preparation: one module per corpus, each turning a corpus folder into a
:class:`~spkflow.corpora.base.CorpusData`, written as a Kaldi data dir by
:func:`~spkflow.corpora.base.write_data_dir`; trial lists in :mod:`spkflow.corpora.trials`.

| name | module | layout |
|---|---|---|
| speechocean762 | :mod:`.speechocean762` | ``{train,test}/{wav.scp,utt2spk,...}`` + ``WAVE/`` |
| dspspeech20 | :mod:`.dspspeech20` | ``speech_data/<spk>/<spk>-<word>-<round>.flac`` |
| fsdd | :mod:`.fsdd` | ``recordings/<digit>_<spk>_<index>.flac`` (8 kHz) |
| librispeech | :mod:`.librispeech` | ``<subset>/<spk>/<chapter>/<spk>-<chapter>-<utt>.flac`` |
"""

from __future__ import annotations

import importlib
from typing import Any

from spkflow.corpora.base import CorpusData

CORPORA = ("speechocean762", "dspspeech20", "fsdd", "librispeech")


def collect(name: str, corpus_dir: str, **options: Any) -> CorpusData:
    """``CorpusData`` of corpus ``name`` (one of :data:`CORPORA`) with its module's options."""
    if name not in CORPORA:
        raise ValueError(f"unknown corpus {name!r}; known: {', '.join(CORPORA)}")
    module = importlib.import_module(f"spkflow.corpora.{name}")
    return module.collect(corpus_dir, **options)
