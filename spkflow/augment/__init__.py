"""Training-time augmentation, drawn from seeded streams so that a resumed run draws the same.

``fbank`` (on fbank crops: speed as new speakers, a random level and equaliser curve per crop,
the 8 kHz telephone band, a room), ``wave`` (on audio crops: noise, reverberation, speed),
``sources`` (the noise and simulated room-impulse-response sets they draw from).

May import: ``core``, ``data``, ``features``.
"""
