"""The daemon's request side: the socket (``server.py``; callers served in turns by
``turns.py``), who may do what (``access.py``), the request handlers (``handlers/``, one
module per request family), ``gq wait``'s waiting clients, listings made off the loop, and
files opened with a job owner's rights."""
