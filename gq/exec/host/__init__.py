"""The execution host, one process per device, run as root: its loop and its link to the
daemon (``loop.py``, started by ``startup.py``), the jobs' processes it owns (``spawn.py``
starts one as its submitter, ``job_processes.py`` limits, freezes, kills and reaps them,
``process_groups.py`` signals their groups), interactive jobs' terminals, the watch on
``--host-mem``, and moving a suspended job's device memory to host memory and back
(``memory_moves.py``, by the table in ``memory_places.py``, through ``checkpoint.py``).
``messages.py`` is the daemon ↔ host wire."""
