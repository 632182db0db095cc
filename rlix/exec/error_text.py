"""Executor layer: an error raised in an actor, made readable for the person who runs the job.

Ray hands the driver an error raised in another process wrapped, its text
coloured for a terminal and headed by Ray's own lines (``RayTaskError(OSError):
ray::TrainerActor.start() ...``). :func:`one_line` digs out what the user's
code or rlix raised, as ``Type: message`` with no colour codes;
:func:`save_traceback` keeps the whole story in the job's output directory.
"""

from __future__ import annotations

import re
import signal
import traceback
from pathlib import Path

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# The last line of a Python traceback: ``SomeError: message`` (module-qualified or not).
_RAISED = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Warning)\b(?::.*)?$")
# Which process Ray says died (an ActorDiedError for a process that exited, crashed or was killed).
_DIED = re.compile(
    r"^\s*class_name: (?P<cls>\S+)(?:.*?^\s*pid: (?P<pid>\d+))?(?:.*?Worker exit type: (?P<exit>\w+))?", re.S | re.M
)


def ending(code: int) -> str:
    """How a process ended, from its exit status (negative: the signal that killed it)."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def os_error(exc: OSError) -> str:
    """``Type: reason`` of a failed file operation (the OS's words, without the path the caller names)."""
    return f"{type(exc).__name__}: {exc.strerror or exc}"


def plain(text: str) -> str:
    """``text`` without terminal colour codes."""
    return _ANSI.sub("", text)


def root_cause(exc: BaseException) -> BaseException:
    """What was raised where it happened: Ray's task errors carry it as ``cause``."""
    seen = {id(exc)}
    while isinstance(getattr(exc, "cause", None), BaseException) and id(exc.cause) not in seen:
        exc = exc.cause
        seen.add(id(exc))
    return exc


def one_line(exc: BaseException) -> str:
    """``Type: message`` of what was raised, one line, no colour codes.

    An error that only Ray's text describes (an actor that died in its
    constructor, a cause that could not be sent) is read from that text: the
    innermost ``...Error: message`` line of the traceback it quotes.
    """
    root = root_cause(exc)
    text = plain(str(root)).strip()
    if type(root).__module__.startswith("ray."):
        quoted = [line.strip() for line in text.splitlines() if _RAISED.match(line.strip())]
        if quoted:
            return quoted[-1] + _which_process(text)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    name = type(root).__name__
    if type(root).__module__.startswith("ray."):
        first += _which_process(text)
    return f"{name}: {first}" if first else name


def _which_process(text: str) -> str:
    """`` (TrainerActor, pid 15601, exit type SYSTEM_ERROR)`` where Ray's text says which process died, else ''.
    A trainer rank and a rollout worker die for different reasons: the one line names which."""
    died = _DIED.search(text)
    if died is None:
        return ""
    parts = [died["cls"]]
    if died["pid"]:
        parts.append(f"pid {died['pid']}")
    if died["exit"]:
        parts.append(f"exit type {died['exit']}")
    return f" ({', '.join(parts)})"


def full_text(exc: BaseException) -> str:
    """The whole traceback, the remote one included (Ray puts it in the error's text), no colour codes."""
    return plain("".join(traceback.format_exception(exc)))


def keep(text: str, directory: str | Path, name: str) -> Path | None:
    """Write ``text`` to ``directory/name`` (a traceback kept for the user); the path, or None if it cannot be written."""
    path = Path(directory) / name
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError:
        return None
    return path


def save_traceback(exc: BaseException, directory: str | Path, name: str = "error.txt") -> Path | None:
    """Write ``exc``'s whole traceback to ``directory/name``; the path, or None if it cannot be written."""
    return keep(full_text(exc), directory, name)


def describe(exc: BaseException, directory: str | Path | None) -> str:
    """The one line a job's failure is reported by, ending with where its traceback was kept."""
    line = one_line(exc)
    kept = save_traceback(exc, directory) if directory is not None else None
    return f"{line} (traceback: {kept})" if kept is not None else line
