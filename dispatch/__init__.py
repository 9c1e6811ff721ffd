"""Starting, signalling and cancelling turn workflows from outside Temporal: the API and the
worker's outbox sweep share it, so both start a turn the same idempotent way."""
