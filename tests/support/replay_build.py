"""Replays workflow histories on the code of an exported build (tests/support/previous_build.py).

Run as a script, not imported: `python replay_build.py TREE HISTORY...` with TREE first on
the path, so that `parley` is that build's. Its last line is one JSON object: where `parley`
came from and, by history file name, "ok" or the replay's error. It then leaves at once,
without the interpreter's shutdown: a replay that failed can leave the SDK core's threads
running, and one of them releasing the GIL while the interpreter finalized aborted the
process once ("PyGILState_Release: thread state ... must be current"), after its answer.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path


async def main(tree: Path, paths: list[Path]) -> None:
    sys.path.insert(0, str(tree))
    from temporalio.client import WorkflowHistory
    from temporalio.worker import Replayer

    import parley
    from parley.workflows.specialist import SpecialistWorkflow
    from parley.workflows.turn import TurnWorkflow

    if not Path(parley.__file__).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"parley came from {parley.__file__}, not from {tree}")
    # No deadlock detector, as tests/support/histories.py `replayer` (imported from there,
    # this script would load the tests' parley, not the tree's).
    replayer = Replayer(workflows=[TurnWorkflow, SpecialistWorkflow], debug_mode=True)
    replayed: dict[str, str] = {}
    for path in paths:
        history = WorkflowHistory.from_json(path.stem, path.read_text())
        try:
            await replayer.replay_workflow(history)
        except Exception as err:  # reported per history, judged by the test
            replayed[path.name] = f"{type(err).__name__}: {err}"
        else:
            replayed[path.name] = "ok"
    print(json.dumps({"parley": str(Path(parley.__file__).parent), "replayed": replayed}))


if __name__ == "__main__":
    asyncio.run(main(Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
