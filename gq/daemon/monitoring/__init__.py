"""Watching the node: each device sampled once a second (``sampling.py``), the thermal and
power guard fed from the samples (``guard.py``), the snapshot a Prometheus scrape reads
(``monitor.py``) and the metrics endpoint (``metrics.py``)."""
