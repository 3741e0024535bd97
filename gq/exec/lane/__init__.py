"""The lane: which resident job's iteration runs next on a device, and how the device passes
between jobs. ``rule.py`` decides (pure; the simulator calls it too) from what ``views.py``
gives it; ``granting.py`` applies it on the host's hot path (workers' READY and DONE);
``leasing.py`` and ``lease.py`` let a job alone on its lane cross boundaries on a shared
page without a message; ``residents.py`` and ``standings.py`` are the host's books on each
resident; ``packing.py`` (pure) and ``packing_moves.py`` put jobs on lanes of their own when
that does more work; ``device_sync.py``, ``paces.py`` and ``memory.py`` are what a release
waits for, a job's pace, and what a lane's memory asks of its jobs."""
