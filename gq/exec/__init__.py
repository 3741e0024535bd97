"""Execution: one host process per device, the jobs it keeps resident, and the lane they
take turns on. Four rooms: ``host/`` (the host's loop, the jobs' processes, spawn, memory
moves), ``cgroups/`` (a cgroup per job, v2 or v1), ``lane/`` (who gets the device next:
grants, leases, the residents' books, packing) and ``job/`` (what runs inside a job's
process: the worker, its hooks, its wire, console and notebook). ``protocol.py`` is the
framing all three ends share."""
