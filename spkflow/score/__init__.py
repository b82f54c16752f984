"""Stage 6 and speaker identification: from embeddings to figures.

``scoring`` (trials, embeddings and cohorts read; cosine scores, AS-norm), ``backend`` (WCCN /
LDA fitted on training embeddings), ``metrics`` (EER, minDCF, DET), ``calibration`` (linear
logistic calibration, Cllr, actual DCF), ``verification`` (a model's whole scoring: backend,
centring, cohort and calibration, saved beside it and packed with it; LLRs and decisions),
``qmf`` (quality measures, calibration trials from the training set), ``evaluation`` (one test
set end to end, ``metrics.json``, RESULTS.md; the QMF fit), ``plots`` (DET, score histograms,
training curves, confusion matrices), ``plan`` (a recipe's scoring plan: the sets stage 5 embeds,
stage 6's steps), ``sid`` (closed- and open-set identification), ``sid_stages`` (what each
identification stage writes, stale figures removed).

May import: ``core``, ``data``.
"""
