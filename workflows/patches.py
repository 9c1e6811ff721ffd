"""The turn workflow's generations: which shape a turn runs, decided without a patch marker.

A new shape is a new build: workers are versioned and every turn is pinned to the build it
started on (dispatch/deployment.py), so a running turn never meets code it was not recorded
with. The turn's input names the shape it was started with (`TurnInput.generation`), so this
code still runs, and replays, the turns of the previous generation: those started by an
older API process, and those an unversioned worker takes over during a deploy.

- 12 (current): no marker. The model call is a local activity and the tail (output screen,
  follow-ups, ending, summary start) one step: a plain answer is one workflow task.
- 11 (previous): one marker, `TURN_V11`, recorded first; it stood for every patch of the
  generations before it (skills one at a time, screens, the fallback named by the input,
  the lifecycle rules, rolling summaries, operator states, the re-answer at the cap, local
  store steps and follow-ups, specialists). Its histories are tests/histories/turn_v11_*.

Older generations' histories and paths are gone: no turn started on them can still be
running (a turn's workflow closes at most 30 minutes after its confirmation wait).
"""

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from parley.contracts import TURN_GENERATION, TurnInput

TURN_V11 = "turn-v11"


def runs_current_shape(inp: TurnInput) -> bool:
    """Whether the turn runs the current shape; a previous-generation turn records (or, on
    replay, finds) its marker here, first thing, as it always did."""
    if inp.generation >= TURN_GENERATION:
        return True
    workflow.patched(TURN_V11)
    return False
