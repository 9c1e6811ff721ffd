"""The API tier: Parley's API, store and worker against the session's shared stack
(tests/conftest.py: one embedded PostgreSQL, one Temporal dev server, one worker, one API),
through `priya`, `marco` and the other session fixtures. A module may serve another API app
on that stack in this event loop (tests/support/stack.py `serve_api`, `api_in_process`); one
that needs a worker of its own, or starts, kills or restarts processes, belongs in
tests/system."""
