"""Executor layer: the user's reward functions, called the way TRL's ``GRPOTrainer`` calls them.

A function is referenced as ``package.module:function`` or
``path/to/file.py:function`` and called as
``fn(completions=[...], prompts=[...], completion_ids=[...], **columns)``,
``columns`` being the dataset's other fields as lists aligned with the
completions. It returns one float, or ``None`` (no opinion), per completion.
A job's reward is the weighted sum over its functions, a ``None`` counting 0
(and counted, so it is reported).

Functions are resolved and their signatures checked when the config is
loaded (:func:`check_reward`) and called on a few dataset rows with dummy
completions before any actor starts; at run time a function that raises or
returns the wrong number of values raises :class:`RewardError`, one line
naming it and where it raised, which fails only that job (its traceback kept
in the job's directory, :meth:`RewardError.kept_in`). The functions run in a process of their own
(:mod:`rlix.exec.data.reward_process`), so one stuck with the interpreter lock held stops nothing of
the job's; one past ``limits.reward_timeout_s`` fails the job naming the line it is stuck at. No torch
here.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import math
import sys
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

# The keyword arguments TRL passes besides the dataset's columns.
TRL_ARGS = ("completions", "prompts", "completion_ids")


class RewardError(RuntimeError):
    """A reward function failed; the message is one line naming it (and, when it raised, where)."""

    def __init__(self, message: str, *, index: int = -1, details: str = "") -> None:
        super().__init__(message)
        self.index = index  # the function's place in the job's rewards (-1: not known)
        self.details = details  # the formatted traceback of what it raised ("" when it returned a bad value)

    def kept_in(self, directory: str | Path | None) -> str:
        """The one line; with a traceback and a ``directory``, the traceback is saved there first
        (``reward_error.txt``) and the line ends with that file's path."""
        line = _one_line(self)
        if not self.details or directory is None:
            return line
        from rlix.exec.error_text import keep

        path = keep(f"{line}\n\n{self.details}", directory, "reward_error.txt")
        return line if path is None else f"{line}; traceback in {path}"


@dataclass(frozen=True, kw_only=True)
class RewardRef:
    """Where a reward function lives: as written in the config, plus the directory relative paths start from."""

    function: str  # "pkg.mod:fn" or "path/to/file.py:fn", as the user wrote it
    weight: float = 1.0
    base_dir: str = "."  # relative file paths and top-level modules are found from here (the run's working directory)

    @property
    def target(self) -> tuple[str, str]:
        where, _, name = self.function.rpartition(":")
        return where, name

    @property
    def is_file(self) -> bool:
        where, _ = self.target
        return where.endswith(".py") or "/" in where or "\\" in where


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def resolve(ref: RewardRef) -> Callable:
    """Import the function ``ref`` names; raise ``ValueError`` (one line: what and how to fix)."""
    where, name = ref.target
    if not where or not name:
        raise ValueError(f"'{ref.function}' is not a reference; write 'package.module:function' or 'path/to/file.py:function'")
    if ref.is_file:
        module = _import_file(Path(ref.base_dir, where))
    else:
        if ref.base_dir not in sys.path:
            sys.path.append(ref.base_dir)  # modules beside the config's working dir import as with `python -m`
        try:
            module = importlib.import_module(where)
        except (Exception, SystemExit) as exc:  # a module that calls sys.exit() is bad input too
            raise ValueError(
                f"cannot import module '{where}' ({type(exc).__name__}: {_one_line(exc)}); check the name, or install the package"
            ) from None
    fn = getattr(module, name, None)
    if fn is None:
        raise ValueError(f"'{where}' has no attribute '{name}'; check the function name")
    if not callable(fn):
        raise ValueError(f"'{ref.function}' is a {type(fn).__name__}, not callable; point it at a function")
    return fn


def _import_file(path: Path):
    path = path.resolve()
    if not path.is_file():
        raise ValueError(f"no file {path}; give the path of a Python file (relative to the working directory)")
    modname = "rlix_reward_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    if modname in sys.modules:
        return sys.modules[modname]
    spec = importlib.util.spec_from_file_location(modname, path)
    if spec is None or spec.loader is None:  # a file Python does not import (.jsonl, .txt)
        raise ValueError(f"{path} is not a Python (.py) file; point the reward at a .py file's function")
    module = importlib.util.module_from_spec(spec)
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))  # sibling helper modules import as they would for a script
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # a file that calls sys.exit() is bad input too
        raise ValueError(f"{path} fails to import ({type(exc).__name__}: {_one_line(exc)}); fix the file") from None
    sys.modules[modname] = module
    return module


def check_signature(fn: Callable, columns: tuple[str, ...]) -> None:
    """``fn`` must accept TRL's keyword arguments plus every dataset column (``**kwargs`` does)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins without a signature: trust them
    try:
        sig.bind(**{k: [] for k in TRL_ARGS + columns})
    except TypeError as exc:
        params = ", ".join(str(p) for p in sig.parameters.values())
        raise ValueError(
            f"signature ({params}) cannot take TRL's arguments ({_one_line(exc)}); "
            "write it as fn(completions, **kwargs), naming any dataset column it needs"
        ) from None


def check_reward(ref: RewardRef, columns: tuple[str, ...]) -> None:
    """Config-time check: ``ref`` imports, is callable and its signature takes the TRL arguments."""
    check_signature(resolve(ref), columns)


@dataclass(frozen=True, kw_only=True)
class FunctionScores:
    """One reward function's values for a batch (``None`` = no opinion)."""

    name: str
    weight: float
    values: tuple[float | None, ...]

    @property
    def nones(self) -> int:
        return sum(1 for v in self.values if v is None)

    @property
    def mean(self) -> float | None:
        xs = [v for v in self.values if v is not None]
        return sum(xs) / len(xs) if xs else None

    @property
    def std(self) -> float | None:
        xs = [v for v in self.values if v is not None]
        if not xs:
            return None
        m = sum(xs) / len(xs)
        return math.sqrt(sum((x - m) ** 2 for x in xs) / len(xs))


@dataclass(frozen=True, kw_only=True)
class RewardBatch:
    totals: tuple[float, ...]  # weighted sum per completion
    functions: tuple[FunctionScores, ...]


class RewardSet:
    """A job's weighted reward functions; resolved lazily in the process that scores."""

    def __init__(self, refs: tuple[RewardRef, ...]) -> None:
        if not refs:
            raise ValueError("a job needs at least one reward function")
        self.refs = refs
        self._fns: list[Callable] | None = None
        self._homes: list[str] = []  # each function's directory (where its user's code lies)
        self.calling = -1  # the function being imported or called now (its index; -1: none)
        self.on_call: Callable[[int, list[str]], None] | None = None  # told of each call before it (the child's note)
        self._process = None  # the child process :meth:`score` calls them in (made at the first batch)

    def __getstate__(self) -> dict:  # functions are imported again where unpickled, and called in a child of its own
        return {"refs": self.refs, "_fns": None, "_homes": [], "calling": -1, "on_call": None, "_process": None}

    def _functions(self) -> list[Callable]:
        if self._fns is None:
            fns = []
            for k, ref in enumerate(self.refs):
                self._calling(k)
                try:
                    fns.append(resolve(ref))
                except ValueError as exc:
                    raise RewardError(f"reward function {ref.function}: {exc}", index=k) from None
            self._homes = [str(_home(fn) or "") for fn in fns]
            self._fns = fns
        return self._fns

    def _calling(self, k: int) -> None:
        self.calling = k
        if self.on_call is not None:
            self.on_call(k, self._homes)

    def score(
        self, *, completions: list, prompts: list, completion_ids: list[list[int]], columns: dict[str, list]
    ) -> RewardBatch:
        """Call every function once on the batch, in the reward set's own process
        (:mod:`rlix.exec.data.reward_process`); raise :class:`RewardError` naming a function that fails."""
        kwargs = dict(completions=completions, prompts=prompts, completion_ids=completion_ids, columns=columns)
        answer = self._child().call(kwargs)
        if answer[0] == "ok":
            return answer[1]
        _, message, index, details = answer
        raise RewardError(message, index=index, details=details)

    def start(self, log: Path | None = None) -> None:
        """Start the child process now, its output appended to ``log`` (None: this process's stderr).
        Started from a thread that lives as long as the job, it dies with that thread even if its parent
        is killed; :meth:`score` starts it otherwise (its output then goes to stderr)."""
        self._child(log).start()

    def close(self) -> None:
        """End the child process (a later :meth:`score` starts another)."""
        if self._process is not None:
            self._process.close()

    def end(self) -> None:
        """End the child process at once and for good (a scoring still running answers an error)."""
        self._child().end()

    def _child(self, log: Path | None = None):
        from rlix.exec.data.reward_process import RewardProcess

        if self._process is None:
            self._process = RewardProcess(self.refs, f"{__name__}:serve", Path(__file__).resolve(), log)
        return self._process

    def call(self, *, completions: list, prompts: list, completion_ids: list[list[int]], columns: dict[str, list]) -> RewardBatch:
        """Call every function once on the batch in this process (the child's part of :meth:`score`)."""
        n = len(completions)
        per_fn = []
        for k, (ref, fn) in enumerate(zip(self.refs, self._functions())):
            self._calling(k)
            try:
                out = fn(completions=completions, prompts=prompts, completion_ids=completion_ids, **columns)
            except (Exception, SystemExit) as exc:  # sys.exit() in a reward ends no run: it is the function's error
                raise RewardError(
                    f"reward function {ref.function} raised {type(exc).__name__}: {_one_line(exc)} at {_raised_at(fn, exc)}",
                    index=k,
                    details="".join(traceback.format_exception(exc)),
                ) from None
            try:
                values = _values(ref, out, n)
            except RewardError as exc:
                raise RewardError(str(exc), index=k) from None
            per_fn.append(FunctionScores(name=ref.function, weight=ref.weight, values=values))
        self._calling(-1)
        totals = tuple(sum(f.weight * (f.values[i] or 0.0) for f in per_fn) for i in range(n))
        return RewardBatch(totals=totals, functions=tuple(per_fn))

    def unfinished(self, seconds: float) -> RewardError:
        """The error for a scoring still running after ``seconds``: it names the function it is in, if any,
        and the ``file:line`` of the user's code it is at. Its process is ended."""
        k, frames, homes = self._process.stuck_at() if self._process is not None else (-1, [], [])
        if k < 0:
            return RewardError(f"the reward functions did not return within {seconds:g} s (limits.reward_timeout_s)", index=k)
        home = homes[k] if k < len(homes) else ""
        mine = [(file, line) for file, line in frames if home and str(Path(file).resolve().parent) == home]
        at = (mine or frames)[:1]
        where = f" at {at[0][0]}:{at[0][1]}" if at else ""
        message = f"reward function {self.refs[k].function} did not return within {seconds:g} s (limits.reward_timeout_s){where}"
        return RewardError(message, index=k, details=_stack_text(frames))


def _stack_text(frames: list[tuple[str, int]]) -> str:
    """Where the functions' process was at the deadline (``frames`` innermost first), as a traceback reads."""
    import linecache

    if not frames:
        return ""
    lines = ["The reward functions' process at its deadline, then killed (most recent call last):"]
    for file, line in reversed(frames):
        lines.append(f'  File "{file}", line {line}')
        if code := linecache.getline(file, line).strip():
            lines.append(f"    {code}")
    return "\n".join(lines) + "\n"


def _raised_at(fn: Callable, exc: BaseException) -> str:
    """``file:line`` where the user's code raised (:func:`_user_line`)."""
    frames = traceback.extract_tb(exc.__traceback__)[1:] or traceback.extract_tb(exc.__traceback__)  # [0]: the call here
    return _user_line(fn, frames)


def _home(fn: Callable) -> Path | None:
    """The directory of ``fn``'s file: its user's code (its own file or a helper beside it); None if not known."""
    try:
        source = inspect.getsourcefile(inspect.unwrap(fn))
    except (TypeError, OSError):
        return None
    return Path(source).resolve().parent if source else None


def _user_line(fn: Callable, frames: list[traceback.FrameSummary]) -> str:
    """``file:line`` of the user's code among ``frames`` (outermost first): the innermost frame in
    :func:`_home` of ``fn``, else the innermost frame of all."""
    home = _home(fn)
    mine = [f for f in frames if home is not None and Path(f.filename).resolve().parent == home]
    at = (mine or frames)[-1]
    return f"{at.filename}:{at.lineno}"


def _values(ref: RewardRef, out: object, n: int) -> tuple[float | None, ...]:
    if isinstance(out, (str, bytes, Mapping, set, frozenset)):  # iterable, but not in the completions' order
        raise RewardError(f"reward function {ref.function} returned a {type(out).__name__}, not a list of {n} floats")
    try:
        values = list(out)
    except TypeError:
        raise RewardError(f"reward function {ref.function} returned a {type(out).__name__}, not a list of {n} floats") from None
    if len(values) != n:
        raise RewardError(
            f"reward function {ref.function} returned {len(values)} values for {n} completions; return one float (or None) per "
            "completion"
        )
    clean: list[float | None] = []
    for v in values:
        if v is None:
            clean.append(None)
            continue
        try:
            if isinstance(v, str | bytes):  # float() reads "1.0"; TRL refuses it
                raise TypeError
            x = float(v)
        except (TypeError, ValueError):
            raise RewardError(f"reward function {ref.function} returned {v!r}, not a number; return floats (or None)") from None
        if math.isinf(x):
            raise RewardError(f"reward function {ref.function} returned {x}; return finite floats")
        clean.append(None if math.isnan(x) else x)  # TRL treats NaN as no opinion too
    return tuple(clean)


def group_advantages(rewards: list[float], groups: list[int]) -> list[float]:
    """(r - group mean) / (group std + eps): GRPO's critic-free baseline."""
    by_group: dict[int, list[float]] = {}
    for r, g in zip(rewards, groups):
        by_group.setdefault(g, []).append(r)
    stats = {}
    for g, rs in by_group.items():
        mean = sum(rs) / len(rs)
        std = math.sqrt(sum((r - mean) ** 2 for r in rs) / len(rs))
        stats[g] = (mean, std)
    return [(r - stats[g][0]) / (stats[g][1] + 1e-4) for r, g in zip(rewards, groups)]


def serve(directory: str) -> None:
    """The reward set's child process (:mod:`rlix.exec.data.reward_process`): read the refs, then batches,
    until the parent closes the pipe."""
    import faulthandler
    import os
    import pickle
    import shutil
    import signal

    files = Path(directory)
    inp, out = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")  # the conversation's own pipes
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # a function (or a program it starts) reading stdin reads nothing
    os.dup2(2, 1)  # and its prints go to stderr
    stacks = open(files / "stacks", "w", encoding="utf-8")  # noqa: SIM115 -- faulthandler writes here until exit
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
    calling = files / "calling"
    rewards = RewardSet(pickle.load(inp))
    rewards.on_call = lambda k, homes: calling.write_text("\n".join([str(k), *homes]) + "\n", encoding="utf-8")
    try:
        while True:
            try:
                kwargs = pickle.load(inp)
            except EOFError:
                return
            try:
                answer: tuple = ("ok", rewards.call(**kwargs))
            except RewardError as exc:
                answer = ("error", str(exc), exc.index, exc.details)
            except BaseException as exc:  # noqa: BLE001 -- anything else its functions raised: said, not a dead child
                details = "".join(traceback.format_exception(exc))
                answer = ("error", f"the reward functions raised {type(exc).__name__}", rewards.calling, details)
            pickle.dump(answer, out)
            out.flush()
    finally:
        shutil.rmtree(files, ignore_errors=True)
