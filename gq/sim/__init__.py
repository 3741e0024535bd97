"""Trace loaders and a discrete-event simulator driven by the real policy objects."""
