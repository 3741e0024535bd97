"""The job side: what runs inside a job's own process, under whatever Python the job uses,
so the standard library alone (no msgspec). ``worker.py`` starts the script; ``hooks.py``,
``outermost_calls.py`` and ``boundaries.py`` find its iterations from PyTorch's calls;
``worker_link.py`` speaks ``messages.py``'s wire to the host; ``session.py`` is the one slot
``gq.steps`` and friends reach; ``console.py`` and ``notebook.py`` run a REPL or a Jupyter
kernel as a job; ``rank_site/`` reports a plain process's steps."""
