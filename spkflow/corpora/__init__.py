"""Corpus data preparation: one module per corpus, each turning a corpus folder into a
:class:`~spkflow.corpora.base.CorpusData`, written as a Kaldi data dir by
:func:`~spkflow.corpora.base.write_data_dir`; trial lists in :mod:`spkflow.corpora.trials`.

The one route from a corpus folder to a data dir is ``python -m spkflow.bin.prepare_corpus
CORPUS [options] CORPUS_DIR OUT_DIR`` (find or fetch the folder, collect, write, validate);
a recipe's ``local/data.sh`` calls it once per data dir.  docs/corpora.md says how to add one.

May import: ``core``, ``data``.

| name | module | layout |
|---|---|---|
| speechocean762 | :mod:`.speechocean762` | ``{train,test}/{wav.scp,utt2spk,...}`` + ``WAVE/`` |
| dspspeech20 | :mod:`.dspspeech20` | ``speech_data/<spk>/<spk>-<word>-<round>.flac`` |
| fsdd | :mod:`.fsdd` | ``recordings/<digit>_<spk>_<index>.flac`` (8 kHz) |
| librispeech | :mod:`.librispeech` | ``<subset>/<spk>/<chapter>/<spk>-<chapter>-<utt>.flac`` |
| voxceleb1 | :mod:`.voxceleb` | ``wav/idXXXXX/<youtube id>/NNNNN.wav`` + official trial lists |
| voxceleb2 | :mod:`.voxceleb` | ``dev/aac/idXXXXX/<youtube id>/NNNNN.m4a`` (decoded by a pipe) |
| musan | :mod:`.musan` | ``{noise,music,speech}/<source>/*.wav`` |
| rirs_noises | :mod:`.musan` | ``simulated_rirs/{small,medium,large}room/RoomNNN/*.wav`` |

Any other folder of recordings (one subfolder per speaker, or a list of files): :mod:`.folder`,
through ``python -m spkflow.bin.make_data_dir``.
"""

from __future__ import annotations

import importlib
from typing import Any

from spkflow.corpora.base import CorpusData, CorpusSpec

#: corpus name -> module that implements it (``SPECS[name]`` and ``collect_<name>`` or ``collect``)
MODULES = {
    "speechocean762": "speechocean762",
    "dspspeech20": "dspspeech20",
    "fsdd": "fsdd",
    "librispeech": "librispeech",
    "voxceleb1": "voxceleb",
    "voxceleb2": "voxceleb",
    "musan": "musan",
    "rirs_noises": "musan",
}
CORPORA = tuple(MODULES)


def _module(name: str) -> Any:
    if name not in MODULES:
        raise ValueError(f"unknown corpus {name!r}; known: {', '.join(CORPORA)}")
    return importlib.import_module(f"spkflow.corpora.{MODULES[name]}")


def spec(name: str) -> CorpusSpec:
    """The :class:`CorpusSpec` of corpus ``name`` (db.sh variable, marker, release, options)."""
    module = _module(name)
    specs = getattr(module, "SPECS", None)
    return specs[name] if specs is not None else module.SPEC


def collect(name: str, corpus_dir: str, **options: Any) -> CorpusData:
    """``CorpusData`` of corpus ``name`` (one of :data:`CORPORA`) with its module's options."""
    module = _module(name)
    fn = getattr(module, f"collect_{name}", None) or module.collect
    return fn(corpus_dir, **options)
