"""What a client may ask the daemon, one module per request family (``submit.py``,
``query.py``, ``control.py``, ``node.py``, with ``common.py`` what they share); ``dispatch.py``
sends each request to its handler, and ``node_view.py`` is all a handler sees of the daemon.
"""
