"""Activities: every piece of I/O a turn performs. Built in `worker.py` with dependencies."""
