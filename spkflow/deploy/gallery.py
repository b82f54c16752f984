"""A saved enrolment ("gallery") for ``python -m spkflow.bin.identify``: enrol once with ``--enrol
DATA_DIR --save GALLERY``, identify against ``--gallery GALLERY`` after, without embedding the
enrolment again.

A gallery is one ``.npz`` file (written atomically, read without pickle): every enrolment
utterance's raw embedding with its speaker and voiced seconds, and a JSON header with the
format, the model's stamp and the embedding size.

What it guarantees
------------------
* **The numbers of an enrolment embedded on the spot**: the raw embeddings are stored, not
  speaker means, so the model's scoring (backend, centring on the enrolment and test recordings,
  AS-norm, calibration) is applied at identification time exactly as with ``--enrol``.
* **Only with the model that made it**: the header carries the model's stamp (the SHA-256 of the
  files that make its embeddings, :func:`spkflow.embed.base.model_stamp`; a packed model and the
  model dir it was packed from share it); another model is refused, naming both.
* **A damaged gallery is named, not scored**: embeddings of another size than its header's (or
  the model's), or holding NaN or infinite values, are refused naming the file, and for a bad
  value the speaker and the utterance.
* **Speakers added, replaced and removed without re-embedding the others**
  (:meth:`Gallery.merge`, :meth:`Gallery.remove`).

Anchor: Kaldi's ``ivector-mean`` writes one mean vector per speaker (``spk_ivector.scp``): it
cannot be re-centred on new data, extended or checked against the extractor that made it.
SpeechBrain and WeSpeaker keep no enrolment.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from spkflow.core.atomic import atomic_write
from spkflow.core.errors import InputError
from spkflow.data.jobs import file_sha256
from spkflow.embed.base import model_files, model_stamp
from spkflow.embed.packed import read_packed

__all__ = ["FORMAT", "Gallery", "embedder_stamp"]

FORMAT = "spkflow-gallery"
FORMAT_VERSION = 1


def embedder_stamp(embedder: Any) -> str:
    """The stamp of the model an :class:`~spkflow.api.Embedder` was loaded from: the files that
    make its embeddings (a pack's members hashed as its model dir's files would be)."""
    src = Path(embedder.source)
    if embedder.toolkit != "spkflow" or src.is_dir():
        return model_stamp(embedder.toolkit, *model_files(embedder.toolkit, src))
    if src.suffix == ".onnx":
        return f"toolkit=onnx {file_sha256(src)}"
    members = read_packed(src).members
    return " ".join(
        ["toolkit=spkflow", *(hashlib.sha256(members[n]).hexdigest() for n in ("config.yaml", "model.pth"))]
    )


@dataclass
class Gallery:
    """Enrolment utterances ``utts`` of ``speakers`` (one per utterance), their raw embeddings
    ``emb [N, D]`` and voiced seconds ``speech``, made with the model of ``stamp``."""

    stamp: str
    utts: list[str]
    speakers: list[str]
    emb: np.ndarray
    speech: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.utts)
        if len(self.speakers) != n or self.emb.shape[0] != n or self.speech.shape != (n,) or self.emb.ndim != 2:
            raise ValueError(
                f"gallery arrays disagree: {n} utterances, {len(self.speakers)} speakers, {self.emb.shape}"
            )

    @classmethod
    def of(cls, stamp: str, utt2spk: dict[str, str], emb: dict[str, np.ndarray], speech: dict[str, float]) -> Gallery:
        """From ``utt -> speaker`` and ``utt -> raw embedding`` (utterances without one left out)."""
        utts = [u for u in utt2spk if u in emb]
        dim = next(iter(emb.values())).shape[-1] if emb else 0
        return cls(
            stamp,
            utts,
            [utt2spk[u] for u in utts],
            np.stack([emb[u] for u in utts]).astype(np.float32) if utts else np.zeros((0, dim), np.float32),
            np.array([speech.get(u, np.nan) for u in utts], dtype=np.float64),
        )

    def speaker_names(self) -> list[str]:
        """Speakers in order of first appearance."""
        return list(dict.fromkeys(self.speakers))

    def groups(self) -> dict[str, np.ndarray]:
        """``speaker -> raw embeddings [n, D]`` of its utterances."""
        spk = np.array(self.speakers)
        return {s: self.emb[spk == s] for s in self.speaker_names()}

    def merge(self, other: Gallery) -> Gallery:
        """This gallery with ``other``'s speakers added (a speaker in both: ``other``'s utterances
        replace this one's); ``other`` must come from the same model."""
        if other.stamp != self.stamp:
            raise ValueError(f"cannot merge galleries of two models ({self.stamp} and {other.stamp})")
        new = set(other.speakers)
        keep = [i for i, s in enumerate(self.speakers) if s not in new]
        return Gallery(
            self.stamp,
            [self.utts[i] for i in keep] + other.utts,
            [self.speakers[i] for i in keep] + other.speakers,
            np.concatenate([self.emb[keep], other.emb.astype(np.float32)]),
            np.concatenate([self.speech[keep], other.speech]),
        )

    def remove(self, speakers: list[str], where: str = "<gallery>") -> Gallery:
        """This gallery without ``speakers``; one it does not hold is an error naming it."""
        absent = [s for s in speakers if s not in set(self.speakers)]
        if absent:
            raise InputError(where, None, f"no speaker {absent[0]!r} to remove (it holds {len(self.speaker_names())})")
        keep = [i for i, s in enumerate(self.speakers) if s not in set(speakers)]
        return Gallery(
            self.stamp,
            [self.utts[i] for i in keep],
            [self.speakers[i] for i in keep],
            self.emb[keep],
            self.speech[keep],
        )

    # ------------------------------------------------------------------ files
    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write the gallery to ``path`` atomically (an ``.npz``)."""
        meta = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "model": self.stamp,
            "dim": int(self.emb.shape[1]),
            "speakers": len(self.speaker_names()),
            "utterances": len(self.utts),
        }
        buf = io.BytesIO()
        np.savez(
            buf,
            meta=np.array(json.dumps(meta)),
            utts=np.array(self.utts, dtype=str),
            speakers=np.array(self.speakers, dtype=str),
            emb=self.emb.astype(np.float32),
            speech=self.speech,
        )
        with atomic_write(path, "wb", encoding=None) as f:
            f.write(buf.getvalue())
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike[str], stamp: str | None = None, dim: int | None = None) -> Gallery:
        """Read a gallery; with ``stamp``, refuse one made with another model, with ``dim``, one
        whose embeddings are of another size.  :class:`InputError` naming the file on anything
        wrong (the speaker and utterance of an embedding that is not finite)."""
        p = Path(path)
        if not p.is_file():
            raise InputError(p, None, "gallery not found (make one with identify --enrol DATA_DIR --save GALLERY)")
        try:
            with np.load(p, allow_pickle=False) as z:
                meta = json.loads(str(z["meta"]))
                arr = {k: z[k] for k in ("utts", "speakers", "emb", "speech")}
        except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
            raise InputError(p, None, f"not a gallery file: {type(exc).__name__}: {exc}") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT:
            raise InputError(p, None, f"not a gallery file: no 'format: {FORMAT}'")
        if meta.get("format_version") != FORMAT_VERSION:
            raise InputError(
                p, None, f"gallery format version {meta.get('format_version')!r}; this reads {FORMAT_VERSION}"
            )
        if stamp is not None and meta.get("model") != stamp:
            raise InputError(
                p,
                None,
                f"made with another model ({meta.get('model')}), not this one ({stamp}): enrol again with "
                "--enrol DATA_DIR --save GALLERY",
            )
        try:
            g = cls(
                str(meta["model"]),
                [str(u) for u in arr["utts"]],
                [str(s) for s in arr["speakers"]],
                arr["emb"].astype(np.float32),
                arr["speech"].astype(np.float64),
            )
        except (ValueError, TypeError) as exc:
            raise InputError(p, None, f"bad gallery: {exc}") from None
        size = g.emb.shape[1]
        if size != meta.get("dim") or (dim is not None and size != dim):
            raise InputError(
                p,
                None,
                f"bad gallery: embeddings of dimension {size}, its header says {meta.get('dim')!r}"
                + (f" and the model makes {dim}" if dim is not None else "")
                + ": enrol again with --enrol DATA_DIR --save GALLERY",
            )
        bad = ~np.isfinite(g.emb).all(axis=1)
        if bad.any():
            i = int(np.argmax(bad))
            raise InputError(
                p,
                None,
                f"bad gallery: the embedding of speaker {g.speakers[i]!r} (utterance {g.utts[i]!r}) holds NaN or "
                f"infinite values ({int(bad.sum())} of {len(g.utts)} utterances): enrol again with --enrol DATA_DIR "
                "--save GALLERY",
            )
        return g
