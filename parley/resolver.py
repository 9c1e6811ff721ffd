"""Reference resolution, in code: which order does the user mean?

The model is never left to guess a referent. The order of evidence is fixed:

1. an id the user stated ("order 8390", "R-5102");
2. the user's pick from the clarification we asked last turn ("the order");
3. "the other one": the known entities minus the current referent — one candidate means
   proceed and say so, several mean ask one question with concrete options;
4. the active slot, if it is fresh;
5. a message that needs a referent but has none: the customer's orders as candidates.

Pure functions over plain data, so every rule is tested without a database or a model.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

ACTIVE_ORDER = "active_order_id"
PENDING_CLARIFICATION = "pending_clarification"
# A slot set more than this many messages ago is stale: ask rather than assume.
FRESH_WITHIN_SEQS = 12

_ORDER_ID = re.compile(r"(?<![\w-])(?:order\s*#?\s*)?(\d{4,10})(?![\w-])", re.IGNORECASE)
_REFUND_ID = re.compile(r"\bR-(\d{3,10})\b", re.IGNORECASE)
_OTHER = re.compile(r"\b(the other|other one|another one|the second one)\b", re.IGNORECASE)
_NEEDS_REFERENT = re.compile(
    r"\b(refund|return|arriv\w*|deliver\w*|email|it|that one|this one)\b", re.IGNORECASE
)


@dataclass(frozen=True)
class Entity:
    type: Literal["order", "refund"]
    id: str
    order_id: str

    @property
    def label(self) -> str:
        return f"Order {self.id}" if self.type == "order" else f"Refund {self.id}"


@dataclass(frozen=True)
class Slot:
    value: Any
    source: str
    set_at_seq: int


@dataclass(frozen=True)
class Option:
    label: str
    value: str
    type: str
    id: str
    order_id: str


@dataclass(frozen=True)
class Clarification:
    question: str
    options: list[Option]

    def as_slot_value(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_slot_value(value: dict[str, Any]) -> Clarification:
        return Clarification(value["question"], [Option(**o) for o in value["options"]])


Kind = Literal["stated", "clarified", "single_candidate", "slot", "clarify", "none"]


@dataclass(frozen=True)
class Resolution:
    kind: Kind
    order_id: str | None = None
    entity_type: str | None = None
    # Said in the reply when we proceed on the only candidate ("Assuming you mean …").
    assumption: str | None = None
    clarification: Clarification | None = None
    # Slots code writes because the referent changed (provenance included).
    slot_writes: dict[str, Slot] = field(default_factory=dict)
    # Slots code clears (a clarification that has been answered or ignored).
    slot_clears: tuple[str, ...] = ()


class NeedsCandidates(Exception):
    """Raised by `resolve` when it needs the customer's entities to decide."""


def resolve(
    text: str,
    *,
    slots: dict[str, Slot],
    user_seq: int,
    entities: list[Entity] | None = None,
) -> Resolution:
    ladder = _Ladder(text, slots, user_seq, entities)
    for step in (ladder.stated, ladder.answered, ladder.the_other_one, ladder.fresh_slot):
        found = step()
        if found is not None:
            return found
    return ladder.needs_referent()


@dataclass(frozen=True)
class _Ladder:
    """One resolution in progress: each rung answers, or passes (None) to the next."""

    text: str
    slots: dict[str, Slot]
    user_seq: int
    entities: list[Entity] | None

    @property
    def active(self) -> Slot | None:
        return self.slots.get(ACTIVE_ORDER)

    @property
    def clears(self) -> tuple[str, ...]:
        return (PENDING_CLARIFICATION,) if PENDING_CLARIFICATION in self.slots else ()

    def known(self) -> list[Entity]:
        if self.entities is None:
            raise NeedsCandidates
        return self.entities

    def moved_to(self, order_id: str, source: str) -> dict[str, Slot]:
        if self.active is not None and self.active.value == order_id:
            return {}
        return {ACTIVE_ORDER: Slot(order_id, source, self.user_seq)}

    def _pick(self, kind: Kind, order_id: str, entity_type: str, source: str) -> Resolution:
        return Resolution(
            kind,
            order_id,
            entity_type,
            slot_writes=self.moved_to(order_id, source),
            slot_clears=self.clears,
        )

    def stated(self) -> Resolution | None:
        """1. A stated id wins."""
        refund = _REFUND_ID.search(self.text)
        if refund:
            refund_id = f"R-{refund.group(1)}"
            known = self.known()
            match = next((e for e in known if e.type == "refund" and e.id == refund_id), None)
            if match is not None:
                return self._pick("stated", match.order_id, "refund", "user_stated")
        order = _ORDER_ID.search(self.text)
        if order:
            return self._pick("stated", order.group(1), "order", "user_stated")
        return None

    def answered(self) -> Resolution | None:
        """2. An answer to the question we asked."""
        pending_slot = self.slots.get(PENDING_CLARIFICATION)
        if pending_slot is None:
            return None
        pending = Clarification.from_slot_value(pending_slot.value)
        lowered = self.text.lower()
        picked = [o for o in pending.options if re.search(rf"\b{o.type}\b", lowered)]
        if len(picked) != 1:
            return None
        return self._pick("clarified", picked[0].order_id, picked[0].type, "clarification")

    def the_other_one(self) -> Resolution | None:
        """3. "The other one": everything known except the current referent."""
        if not _OTHER.search(self.text):
            return None
        current = self.active.value if self.active is not None else None
        return self._from_candidates([e for e in self.known() if e.order_id != current])

    def fresh_slot(self) -> Resolution | None:
        """4. A fresh slot."""
        active = self.active
        if active is not None and active.set_at_seq >= self.user_seq - FRESH_WITHIN_SEQS:
            return Resolution("slot", str(active.value), "order", slot_clears=self.clears)
        return None

    def needs_referent(self) -> Resolution:
        """5. The message needs a referent and none is known: the customer's orders."""
        if _NEEDS_REFERENT.search(self.text):
            return self._from_candidates([e for e in self.known() if e.type == "order"])
        return Resolution("none", slot_clears=self.clears)

    def _from_candidates(self, candidates: list[Entity]) -> Resolution:
        return _from_candidates(candidates, self.moved_to, self.clears)


def _from_candidates(
    candidates: list[Entity], moved_to: Any, clears: tuple[str, ...]
) -> Resolution:
    if not candidates:
        return Resolution("none", slot_clears=clears)
    if len(candidates) == 1:
        only = candidates[0]
        return Resolution(
            "single_candidate",
            only.order_id,
            only.type,
            assumption=f"Assuming you mean {only.label.lower()}.",
            slot_writes=moved_to(only.order_id, "single_candidate"),
            slot_clears=clears,
        )
    options = [
        Option(
            label=e.label, value=f"The {e.type} {e.id}", type=e.type, id=e.id, order_id=e.order_id
        )
        for e in candidates
    ]
    named = " or ".join(o.label[0].lower() + o.label[1:] for o in options)
    question = f"Which one do you mean: {named}?"
    return Resolution("clarify", clarification=Clarification(question, options), slot_clears=clears)
