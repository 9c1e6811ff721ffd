"""The turn workflow's patches: each marks where turns started on newer code take another
path than the committed histories of older turns replay (tests/test_replay.py).

A patch costs a new turn a marker and an update of the `TemporalChangeVersion` search
attribute (the SDK adds one to every marker: a visibility write on the server). So a turn
started on this code records one marker, `ALL_PATCHES`, that stands for every patch below;
older turns replay through the markers they recorded. A new patch is added below and checked
with `Patches.taken` like the others (a new turn records its own marker until the next
consolidation adds a generation, see `GENERATIONS`).
"""

from temporalio import workflow

# Turns that asked for skills before skills ran one at a time replay as they ran (in
# parallel with the reads); the marker is written only by a response that holds a skill call.
SKILLS_PATCH = "skills-serial-v1"
# Turns started before screens existed replay without them.
SCREENS_PATCH = "screens-v1"
# Turns started before the input said whether a fallback model exists replay the old way:
# schedule the fallback and learn from its error that there is none.
FALLBACK_PATCH = "fallback-from-input"
# Turns started before the lifecycle rules replay without them: a Stop honoured at every
# step boundary, model requests counted with their retries and the confirmation path, and
# the turn's own words when the budget is spent after a send.
LIFECYCLE_PATCH = "lifecycle-v1"
# Turns started before rolling summaries existed replay without starting one.
SUMMARIES_PATCH = "summaries-v1"
# Turns started before it upsert the state search attribute at every move; with it, only
# into and out of the states an operator looks a turn up by (resting on a card, ended), so a
# running turn's attribute says `received` (set at its start). Every move still shows in the
# current details.
OPERATOR_STATES_PATCH = "operator-states-v1"
# Turns started before it end at the tool loop's cap with the bounds text; with it, the loop
# keeps one request back and a step without tools words an answer from what the turn found.
REANSWER_PATCH = "reanswer-v1"
# Turns started before it schedule the start of their rolling summary as a regular activity;
# with it, the start is a local activity of the worker that ran the turn (one task fewer for
# the server per turn).
LOCAL_SUMMARY_START_PATCH = "summary-start-local-v1"
# Turns started before specialists existed never delegated; the marker is written only by a
# turn that does, so histories without a delegation replay unchanged.
SPECIALIST_PATCH = "specialist-v1"
# Turns started before it run their store steps (context, the card, finalize, expiry) and
# their screens as regular activities; with it, as local activities of the worker running the
# turn: no task for the server to dispatch and no worker to poll for it, the result recorded
# with the workflow task (the input screen and the first context still run side by side).
# The steps that heartbeat (model, tools, send), the follow-ups and the endings by failure
# or cancel stay regular.
LOCAL_STORE_PATCH = "local-store-steps-v1"
# Turns started before it ask for follow-up suggestions as a regular activity beside the
# output screen, with a timer for their grace; with it, as a local activity (rules and one
# write, no model call): a plain turn's answer is screened, offered follow-ups, finalized and
# its summary considered in one workflow task, and its only regular activity is the model.
LOCAL_FOLLOWUPS_PATCH = "local-followups-v1"

# The patches the turn-v9 marker stands for (turns started from its consolidation on).
TURN_V9 = frozenset(
    {
        SKILLS_PATCH,
        SCREENS_PATCH,
        FALLBACK_PATCH,
        LIFECYCLE_PATCH,
        SUMMARIES_PATCH,
        OPERATOR_STATES_PATCH,
        REANSWER_PATCH,
        LOCAL_SUMMARY_START_PATCH,
        SPECIALIST_PATCH,
    }
)
# The patches the turn-v10 marker stands for.
TURN_V10 = TURN_V9 | {LOCAL_STORE_PATCH}
# The marker a new turn records for every patch above.
ALL_PATCHES = "turn-v11"
# Each marker that stood for many, newest first, with the patches it stands for. A later
# consolidation adds its own line above the others (and becomes ALL_PATCHES); the older lines
# stay while turns that recorded them may still replay.
GENERATIONS: tuple[tuple[str, frozenset[str]], ...] = (
    (ALL_PATCHES, TURN_V10 | {LOCAL_FOLLOWUPS_PATCH}),
    ("turn-v10", TURN_V10),
    ("turn-v9", TURN_V9),
)


class Patches:
    """Which paths a turn takes: the patches of the generation marker it recorded (checked
    once, first thing; a new turn records the newest), else each patch by its own marker."""

    def __init__(self) -> None:
        self._covered: frozenset[str] = frozenset()

    def start(self) -> None:
        for marker, covered in GENERATIONS:
            if workflow.patched(marker):
                self._covered = covered
                return

    def taken(self, patch: str) -> bool:
        return patch in self._covered or workflow.patched(patch)
