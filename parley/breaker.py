"""A circuit breaker per backend, so a dead service is not hammered by every turn.

closed --(N failures in a row)--> open --(cooldown passes)--> half-open
half-open --(the one trial call succeeds)--> closed;  --(it fails)--> open again

While open, calls are refused at once and the tool returns `unavailable` to the model.
The clock is injected so the state machine is tested without sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import StrEnum


class BreakerState(StrEnum):
    closed = "closed"
    open = "open"
    half_open = "half_open"


class CircuitBreaker:
    def __init__(
        self,
        *,
        failure_threshold: int = 3,
        cooldown_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._failures = 0
        self._opened_at: float | None = None
        self._trial_in_flight = False

    @property
    def state(self) -> BreakerState:
        if self._opened_at is None:
            return BreakerState.closed
        if self._clock() - self._opened_at >= self.cooldown_s:
            return BreakerState.half_open
        return BreakerState.open

    def allow(self) -> bool:
        """May a call go out now? In half-open only one trial call is let through."""
        state = self.state
        if state == BreakerState.closed:
            return True
        if state == BreakerState.half_open and not self._trial_in_flight:
            self._trial_in_flight = True
            return True
        return False

    def record_success(self) -> None:
        self._failures = 0
        self._opened_at = None
        self._trial_in_flight = False

    def record_failure(self) -> None:
        self._trial_in_flight = False
        self._failures += 1
        if self._opened_at is not None or self._failures >= self.failure_threshold:
            self._opened_at = self._clock()
