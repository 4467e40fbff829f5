"""The main loop: ``run`` (one screen), its two schedules, one ``cycle`` of SPADE, the
batcher that turns plays into samples, and the ``runtime`` that owns the processes.

Imports run one way: ``run`` -> ``schedule_*`` -> ``cycle`` -> ``batcher`` -> roles,
rewards, trainer client; nothing below the loop imports it back.
"""
