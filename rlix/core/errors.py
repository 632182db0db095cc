"""Core layer: the two ways the core says no.

``SchedulingError`` is the caller's mistake (bad topology, unknown pipeline,
duplicate request); its message names the field and the fix, and the core's
state is unchanged. ``InvariantViolation`` is the core's own bug: a plan that
would break a named invariant is never handed out.
"""

from __future__ import annotations


class SchedulingError(ValueError):
    """An event the core refuses; the state is as it was before the event."""


class InvariantViolation(AssertionError):
    """A plan broke a named invariant (a bug in a policy, never user error)."""

    def __init__(self, invariant: str, detail: str) -> None:
        super().__init__(f"invariant '{invariant}' violated: {detail}")
        self.invariant = invariant
