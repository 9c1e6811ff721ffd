"""The session API: the only door for browsers (auth, ordering, idempotency, streaming)."""
