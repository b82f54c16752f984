"""Helpers shared by the test suite, by concern (test files import from here, never from each other).

paths       the repository root, the TEMPLATE recipe, the db.sh variables
audio       synthetic voices, speakers and mixed-rate audio, and the Kaldi data dirs listing them
datadirs    Kaldi data dirs written from keyword arguments and read back; bash run as utils/*.sh run
models      tiny spkflow model dirs with random weights (and a fitted scoring), BatchNorm statistics, L2 norms
vectors     speaker embeddings made here, written as kaldiio arks, and their all-pairs trials
spread      float bounds between two computation paths, and the record of the spreads measured
diar        simulated conversations of synthetic voices as recording dirs, window embeddings
procs       processes: /proc, a small disk, running the venv's Python
heap        a probe of a process's heap (page faults of a batch freed and made again), as source text
cudart      stand-ins for CUDA's runtime and events, timing ones too (page-locked batch slots, bench_gpu; no GPU here)
corpora     mini copies of each corpus's layout, data-dir validity
recipes     a recipe in a mirror of the project, the extraction script and its environment
train       a training set-up (data dir, features, batch lists, config) and the trainer's CLI arguments
slow_step   a chosen call made slow in the processes a test starts (a step under way when a signal comes)
schedulers  a real single-host Slurm and Grid Engine (the fixtures conftest.py imports)
suite       how the suite is spread over pytest -n N workers (conftest.py's hooks)
bench       what the benchmarks under test/bench share (best-of-N wall time)
compat      work-arounds for third-party behaviour that breaks the test run itself (not spkflow)
"""
