"""When each job will start and end: forecasts made in a child off the daemon's loop
(``forecasting.py``), from a snapshot of what the last pass read (``snapshot_jobs.py``),
and a first guess for a job submitted since the last one (``first_guess.py``)."""
