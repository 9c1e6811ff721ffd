"""The unit tier: pure code, read or run in this process; no database, no Temporal server, no
server on a port, no Parley process, no browser. Each module here runs in seconds. (The demo
backend through ASGITransport is fine.) A test that needs the session's services belongs in
tests/api; one that serves its own (a worker, an API, a fake provider) in tests/system."""
