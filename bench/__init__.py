"""`make bench`: Parley's streaming latency and throughput beside a no-Temporal, no-database
baseline serving the same demo model, both measured in one run (`python -m bench`)."""
