"""A cgroup per job, on cgroup v2 or v1 behind one interface (``job_cgroups.py``): memory
and pid limits, freezing, device access, what a job holds. ``hierarchies.py`` finds where
the hierarchies are mounted and where gq's cgroups go, ``files.py`` reads and writes their
control files, ``tasks.py`` counts and bounds their tasks."""
