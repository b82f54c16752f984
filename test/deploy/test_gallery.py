"""A saved enrolment that is damaged (spkflow.deploy.gallery): NaN in an embedding, embeddings of
another size than its header or the model say; each refused by identify naming the gallery file
and what is wrong (for a bad value, the speaker and the utterance).  A tiny model with random
weights; the galleries are written by Gallery.save as identify --save writes them."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.audio import make_speakers
from helpers.models import make_spkflow_model_dir
from helpers.recipes import run
from spkflow.core.errors import InputError
from spkflow.deploy.gallery import Gallery

PY = sys.executable


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from spkflow import Embedder
    from spkflow.deploy.gallery import embedder_stamp

    root = tmp_path_factory.mktemp("gallery")
    model = make_spkflow_model_dir(root / "model")
    data = make_speakers(root / "enrol", num_spk=2, num_utt=2, seed=4)
    emb = Embedder.from_pretrained(model)
    wav = dict(line.split(None, 1) for line in (data / "wav.scp").read_text().splitlines())
    u2s = dict(line.split() for line in (data / "utt2spk").read_text().splitlines())
    vecs = {u: emb.embed_file(p) for u, p in wav.items()}
    good = Gallery.of(embedder_stamp(emb), u2s, vecs, {u: 1.0 for u in u2s})
    return {"model": model, "gallery": good, "dim": emb.dim, "test": next(iter(wav.values()))}


def identify(setup: dict, gallery: Path) -> str:
    p = run([PY, "-m", "spkflow.bin.identify", "--model", setup["model"], "--gallery", gallery, setup["test"]],
            check=False)  # fmt: skip
    assert p.returncode == 1, p.stdout
    return p.stderr


def test_a_gallery_with_nan_names_the_file_speaker_and_utterance(setup, tmp_path):
    g: Gallery = setup["gallery"]
    emb = g.emb.copy()
    emb[2, 3] = np.nan
    bad = Gallery(g.stamp, g.utts, g.speakers, emb, g.speech).save(tmp_path / "nan.npz")
    err = identify(setup, bad)
    assert f"{bad}: bad gallery: the embedding of speaker {g.speakers[2]!r} (utterance {g.utts[2]!r})" in err
    assert "NaN or infinite values (1 of 4 utterances)" in err and "Traceback" not in err


def test_a_gallery_of_another_dimension_is_named(setup, tmp_path):
    g: Gallery = setup["gallery"]
    short = Gallery(g.stamp, g.utts, g.speakers, g.emb[:, :-2], g.speech).save(tmp_path / "short.npz")
    err = identify(setup, short)
    d = setup["dim"]
    assert (
        f"{short}: bad gallery: embeddings of dimension {d - 2}, its header says {d - 2} and the model makes {d}" in err
    )
    # a header that disagrees with its embeddings (edited): named without a model too
    import json

    with np.load(short) as z:
        parts = {k: z[k] for k in z.files}
    meta = json.loads(str(parts["meta"]))
    parts["meta"] = np.array(json.dumps({**meta, "dim": d}))
    np.savez(tmp_path / "edited.npz", **parts)
    with pytest.raises(
        InputError, match=rf"edited.npz: bad gallery: embeddings of dimension {d - 2}, its header says {d}"
    ):
        Gallery.load(tmp_path / "edited.npz")
    assert Gallery.load(g.save(tmp_path / "good.npz"), g.stamp, d).speakers == g.speakers
