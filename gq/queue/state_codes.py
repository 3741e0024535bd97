"""Job states as the daemon's answers name them, and squeue's short codes: what a client
reads a listing with. Plain strings, so that ``gq status`` need not import ``enum``;
:class:`gq.queue.states.JobState` is built from these."""

SHORT = {
    "PENDING": "PD",
    "RUNNING": "R",
    "COMPLETED": "CD",
    "FAILED": "F",
    "CANCELLED": "CA",
    "TIMEOUT": "TO",
    "DEADLINE": "DL",  # it could not end before its --deadline (Slurm's DL)
}
TERMINAL = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "DEADLINE"})
ACTIVE = frozenset({"PENDING", "RUNNING"})
