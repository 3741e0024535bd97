import sys

print("exiting 3", flush=True)
sys.exit(3)
