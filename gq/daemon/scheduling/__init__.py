"""Deciding what runs where. ``scheduler.py`` is the scheduling pass; ``admission.py``
(pure) places jobs on devices and lanes and backfills; ``pending_reasons.py`` says why a job
waits; ``residency.py`` and ``lane_waits.py`` share a device's resident slots; ``fair_share.py``
keeps each user's decayed lane time; ``preemption.py`` (pure) and ``preempting.py`` move
lower jobs' memory out for a higher one."""
