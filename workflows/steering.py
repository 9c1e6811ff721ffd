"""What a turn knows of its steers (store/steering.py): the ones the API delivered as the
Update `steer` and the newest one its steps have taken. Workflow code, run inside the turn
workflow; the running steps hear a steer from the store's doorbell, so this only matters
where no step runs: a card's wait, which a steer wakes."""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from parley.activities.screens import ScreenActivities
    from parley.contracts import BuildContextResult, ScreenInput, SteerInput, TurnInput

from parley.workflows.options import SCREEN
from parley.workflows.tool_batch import honour_cancel


class EndingSteered(Exception):
    """The turn's ending refused: a steer came in after its last model call."""


class SteerDeclined(Exception):
    """The input screen declined a steering message: the turn ends with the decline text,
    its step never called (`model_call_id`: the step built with it)."""

    def __init__(self, model_call_id: str) -> None:
        super().__init__(model_call_id)
        self.model_call_id = model_call_id


class Steers:
    def __init__(self) -> None:
        self.delivered: list[str] = []  # message ids, in the order the API delivered them
        self.newest = 0  # the newest delivered seq
        self.taken = 0  # the newest seq the turn has answered (or set aside, `take_all`)
        # The newest seq a step's build took, its steers screened: a later step screens only
        # the steers past it, whatever `take_all` set aside.
        self.screened = 0

    def deliver(self, steer: SteerInput) -> int:
        """Record a delivered steer (once); how many the turn has had."""
        if steer.message_id not in self.delivered:
            self.delivered.append(steer.message_id)
            self.newest = max(self.newest, steer.seq)
        return len(self.delivered)

    def took(self, seq: int | None) -> None:
        """A step's build took the steers up to `seq`, screened (None: it read none)."""
        self.taken = max(self.taken, seq or 0)
        self.screened = max(self.screened, seq or 0)

    @property
    def waiting(self) -> bool:
        """A delivered steer no step has taken yet."""
        return self.newest > self.taken

    def take_all(self) -> None:
        self.took(self.newest)


async def screened(inp: TurnInput, built: BuildContextResult, steers: Steers) -> None:
    """A step's build took steers no step took before: the input screen checks them, as it
    checks every message, before the model sees them. `SteerDeclined` when it declines."""
    before = steers.screened
    steers.took(built.steer_seq)
    if steers.screened == before:
        return
    verdict = await SCREEN.run_local(
        ScreenActivities.screen_input,
        ScreenInput(inp.turn_id, steers_after=before),
        summary="screen the steer",
    )
    honour_cancel()
    if not verdict.allowed:
        raise SteerDeclined(built.model_call_id)
