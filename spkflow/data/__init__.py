"""Kaldi data directories and what is read through them.

``tables`` (the text tables, byte-exact, errors naming file and line), ``datadir``
(:class:`~spkflow.data.datadir.DataDir`), ``check`` (``validate_data_dir.sh``), ``steps`` /
``fix`` / ``subset`` / ``combine`` (Kaldi's ``fix_data_dir.sh``, ``subset_data_dir.sh``,
``combine_data.sh``, ``copy_data_dir.sh``, same bytes), ``audio`` (wav.scp entries, segments,
resampling; ``pipes``: its ``cmd |`` entries run and decoded), ``ark`` (Kaldi arks read by
offset), ``jobs`` (the one toolkit for a stage's parallel jobs: splits, staged outputs, commit
logs, stamps, merges).

May import: ``core``.
"""
