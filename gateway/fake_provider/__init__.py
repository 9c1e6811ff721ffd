"""A fake model provider for trying Parley's wire formats without a real one.

Not used in production: tests run the real SDKs against it, and the README offers it to
users (`python -m parley.gateway.fake_provider --port 8200 --brain`). `wire` encodes and decodes the
providers' streaming formats; `server` is the HTTP app with its scripts and faults.
"""
