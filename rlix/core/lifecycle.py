"""Core layer: explicit lifecycle state machines.

Pipelines and gang-stage requests move only along the edges listed here;
anything else is a caller error raised before the state changes.
"""

from __future__ import annotations

import enum

from rlix.core.errors import SchedulingError


class PipelineState(enum.Enum):
    ACTIVE = "active"
    GONE = "gone"


class RequestState(enum.Enum):
    PENDING = "pending"
    GRANTED = "granted"
    RELEASED = "released"


PIPELINE_TRANSITIONS: dict[PipelineState | None, frozenset[PipelineState]] = {
    None: frozenset({PipelineState.ACTIVE}),
    PipelineState.ACTIVE: frozenset({PipelineState.GONE}),
    PipelineState.GONE: frozenset(),
}

REQUEST_TRANSITIONS: dict[RequestState | None, frozenset[RequestState]] = {
    None: frozenset({RequestState.PENDING}),
    RequestState.PENDING: frozenset({RequestState.GRANTED, RequestState.RELEASED}),
    RequestState.GRANTED: frozenset({RequestState.RELEASED}),
    RequestState.RELEASED: frozenset(),
}


def check_transition(table: dict, current: enum.Enum | None, target: enum.Enum, what: str) -> None:
    if target not in table[current]:
        now = current.value if current is not None else "absent"
        raise SchedulingError(f"{what}: cannot go from {now} to {target.value}")
