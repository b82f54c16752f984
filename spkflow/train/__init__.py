"""Stages 3 and 4: batches and training.

``spk2utt`` and ``batches`` (N x M batch plans: exhaustive, deterministic, distributed,
resumable), ``shard_plan`` (the same plans by windows of shards), ``config`` (the training
config's schema: every key checked at load), ``stores`` (where crops are read: arks, shards of
features, audio files, shards of audio, one interface), ``loader`` and ``raw_loader`` (the N x M
datasets over a store: feature crops, or fbank of augmented audio crops), ``data`` (input
statistics, batch lists per rank, what stage 4 reads, the epoch's dataset), ``optim`` (optimiser and schedule, scaled
to the global batch), ``state`` (RNG state, averaging, stop flag, progress, model.pth /
loss.pth), ``resume`` (a resume's config against the checkpoint's: refused, or a new schedule),
``monitor`` (step lines, gradient norms, TensorBoard events), ``validation`` (EER while
training), ``build`` (the run's setup: device, DDP group, model, optimiser, resume or
initialisation), ``trainer`` (the loop: epochs, steps, checkpoints), ``process`` (a rank's logs, threads
and exit).

May import: ``core``, ``data``, ``features``, ``augment``, ``nnet``, ``score``, ``embed``.
"""
