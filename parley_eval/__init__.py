"""`parley eval`: labelled conversations run against a running Parley through its HTTP API,
scored on state (referents, clarifications, tool calls, the write invariant), latency and
tokens. The suite files and their schema are in `suite.py`; running is `runner.py`; scoring
(pure) is `score.py`; the outputs are `report.py` and `html.py`."""
