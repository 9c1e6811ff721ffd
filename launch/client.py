"""The OpenAPI document the typed client is generated from (`make client`): the app's own,
with the code's default settings (a deployment's limits, such as the message length, are in
its live `/openapi.json`), written as JSON to the path given.

    python -m parley.launch.client build/openapi.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from parley.config import Settings


def client_document() -> dict[str, Any]:
    from parley.api.main import create_app

    # The client is the same on every machine that makes it: only the limits a PARLEY_MAX_*
    # variable sets would differ, and the generated types carry no lengths.
    return create_app(Settings(env="dev")).openapi()


def main(argv: list[str]) -> None:
    [path] = argv
    Path(path).write_text(json.dumps(client_document(), indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
