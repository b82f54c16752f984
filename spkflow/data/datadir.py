"""A Kaldi data directory on disk: :class:`DataDir` reads its tables and checks itself.

The tables are read by :mod:`spkflow.data.tables` (errors name the file and line); the checks
of :meth:`DataDir.validate` live in :mod:`spkflow.data.check`.  Standard library only.
"""

from __future__ import annotations

import os
from pathlib import Path

from spkflow.core.errors import InputError
from spkflow.data.check import check_data_dir
from spkflow.data.tables import PathLike, as_number, read_kv, read_spk2utt, utt2spk_to_spk2utt

__all__ = ["DataDir"]


class DataDir:
    """A Kaldi data directory on disk.

    >>> d = DataDir("data/train")          # doctest: +SKIP
    >>> d.validate(no_text=True, no_feats=True)
    >>> d.utt2spk()["spk1-utt1"]
    'spk1'
    """

    def __init__(self, path: PathLike) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"DataDir({os.fspath(self.path)!r})"

    def file(self, name: str) -> Path:
        """Path of ``name`` inside the data dir (existing or not)."""
        return self.path / name

    def has(self, name: str) -> bool:
        return (self.path / name).is_file()

    def utt2spk(self) -> dict[str, str]:
        """``utt -> spk`` (InputError unless every line has exactly 2 fields and keys are unique)."""
        return read_kv(self.file("utt2spk"), num_fields=2)

    def spk2utt(self) -> dict[str, list[str]]:
        """``spk -> [utts]`` from spk2utt, or derived from utt2spk when spk2utt is absent."""
        if self.has("spk2utt"):
            return read_spk2utt(self.file("spk2utt"))
        return utt2spk_to_spk2utt(self.utt2spk())

    def utts(self) -> list[str]:
        return list(self.utt2spk())

    def spks(self) -> list[str]:
        return list(self.spk2utt())

    def table(self, name: str) -> dict[str, str]:
        """Any key-value table of the data dir (``wav.scp``, ``utt2dur``, ...)."""
        return read_kv(self.file(name))

    def utt2dur(self) -> dict[str, float]:
        """``utt -> seconds`` (InputError naming the line of a non-positive or non-numeric value)."""
        p = self.file("utt2dur")
        out: dict[str, float] = {}
        for n, (k, v) in enumerate(read_kv(p, num_fields=2).items(), 1):
            x = as_number(v)
            if x is None or not x > 0:
                raise InputError(p, n, f"duration of {k!r} must be a positive number, got {v!r}")
            out[k] = x
        return out

    def validate(
        self,
        *,
        no_feats: bool = True,
        no_text: bool = True,
        no_wav: bool = False,
        no_spk_sort: bool = False,
        non_print: bool = False,
    ) -> list[str]:
        """Check the data dir like Kaldi's ``validate_data_dir.sh``; return warnings.

        The ``no_*`` flags mean "this file need not exist" (it is still checked when it
        does).  Defaults suit speaker recipes (no ``text``, no ``feats.scp`` needed); the
        ``utils/validate_data_dir.sh`` front end keeps Kaldi's defaults.

        Deliberate differences from Kaldi (stricter; all on inputs Kaldi's later stages
        would trip on): a utt2spk line without exactly 2 fields fails (Kaldi prints
        "wrong format" but exits 0); ``segments`` must list exactly the utterances of
        utt2spk even without ``text`` (Kaldi checks it only when ``text`` exists); a
        spk2utt speaker without utterances fails; utt2dur / utt2num_frames / reco2dur
        values must be numbers (awk compares non-numbers as strings and lets "abc" pass);
        a blank line is always an error; an id (utterance, speaker, recording) with bytes that
        are not UTF-8 fails (:func:`~spkflow.data.check.check_utf8_ids`; Kaldi passes it, and stage 2 could not
        write features under it).  On the text checks see
        :func:`spkflow.data.check._non_printable`.  The checks live in :mod:`spkflow.data.check`.
        """
        return check_data_dir(
            self.path, no_feats=no_feats, no_text=no_text, no_wav=no_wav, no_spk_sort=no_spk_sort, non_print=non_print
        )
