"""Foundations every other package stands on, standard library only.

``errors`` (errors that name the file and line, or the utterance), ``atomic`` (outputs written
under a temporary name and renamed into place), ``lock`` (one writer per output dir, holder
named), ``procs`` (children that die with their parent; a script whose whole tree stops with
it), ``kaldi_opts`` (Kaldi's ``--opt=value`` config files), ``checks``
(:class:`~spkflow.core.checks.ConfigError` and the ``check_*`` helpers every config reader
uses), ``batch_wait`` (how long a loop waits for its batches: the loader's or the model's pace),
``version``.

May import: nothing of spkflow.
"""
