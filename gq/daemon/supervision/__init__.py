"""The daemon's side of the execution hosts: starting or re-adopting one per device
(``host_handles.py``), what it tells them (``launch_specs.py``) and what they report
(``supervisor.py``: starts, ``progress.py``, memory ``probes.py``, ``endings.py``), the
record of each running job (``running.py``), jobs no live host runs (``recovery.py``), and
what runs when jobs change state (``notify.py``)."""
