"""Stage 6 and speaker identification: from embeddings to figures.

Each module's name says what it holds:

* ``trial_scoring``: trial lists, embeddings and cohorts read; cosine scores and AS-norm of a
  trials file; scores written (the mechanics every scoring uses);
* ``backend``: WCCN / LDA fitted on training embeddings;
* ``calibration``: linear logistic calibration (scores to LLRs), Cllr, actual DCF;
* ``model_scoring``: the scoring that travels with a model (:class:`Scoring`: backend, centring,
  AS-norm cohort and calibration, saved beside it and packed with it): two embeddings to a score,
  an LLR and a same-speaker decision; stage 6, the API, ``verify``, ``identify`` and diarization
  all score through it;
* ``metrics``: EER, minDCF, DET curves;
* ``qmf``: quality measures, calibration trials from the training set;
* ``eval_report``: one test set scored and reported (``scores``, ``metrics.json``, plots), the
  experiment's RESULTS.md, the QMF fit (the work of ``spkflow.bin.score`` / ``fit_qmf``);
* ``scoring_plan``: a recipe's scoring plan (the sets stage 5 embeds, stage 6's steps; the work of
  ``spkflow.bin.scoring_plan``);
* ``plots``: DET, score histograms, training curves, confusion matrices;
* ``sid`` (closed- and open-set identification), ``sid_stages`` (what each identification stage
  writes, stale figures removed).

Decisions on new recordings with a model (``verify``, ``identify``) are
:mod:`spkflow.deploy.decisions`.

May import: ``core``, ``data``.
"""
