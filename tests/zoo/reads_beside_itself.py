"""Reads data relative to its own file, and says how it was named."""

import os
import sys

with open(os.path.join(os.path.dirname(__file__), "data", "x.csv")) as handle:
    rows = handle.read().split()
print(f"rows={len(rows)} file={__file__} argv0={sys.argv[0]} path0={sys.path[0]}")
