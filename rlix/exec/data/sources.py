"""Executor layer: a job's prompts from the user's own files.

A job's ``data`` block names a JSONL file, a Parquet file, or a directory
saved by the ``datasets`` library (read locally; nothing is downloaded), and
the column holding the prompt. Every other column of a row travels with its
prompt to the reward functions. Reading and checking happen when the config
is loaded (:func:`read_checked`, one-line :class:`DataError` naming the
field); tokenizing happens in the driver once the model directory exists
(:func:`prepare`): the checkpoint's own tokenizer, its chat template unless
``chat_template: false``, prompts too long for the model left out and
counted, and characters the tokenizer has no token for counted. :class:`DatasetPrompts` then serves each step's prompts: rows
shuffled by the job's seed, cycled epoch after epoch. Imports only pydantic
here; ``datasets`` and ``transformers`` are imported by the functions that
need them.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from pydantic import Field

from rlix.config import TOO_MANY_DIGITS, StrictModel
from rlix.exec.data.rewards import TRL_ARGS


class DataConfig(StrictModel):
    """Prompts from a local file: JSONL, Parquet, or a ``datasets`` directory (save_to_disk)."""

    path: str = Field(
        min_length=1, description="a .jsonl / .parquet file or a datasets directory, relative to the working directory"
    )
    prompt_field: str = Field(
        default="prompt", min_length=1, description="column holding the prompt (text, or a list of chat messages)"
    )
    split: str = Field(default="train", description="split to read when the directory holds several (a DatasetDict)")
    chat_template: bool = Field(default=True, description="apply the tokenizer's chat template when it has one")


class EvalConfig(StrictModel):
    """A held-out split scored every ``eval_every`` steps (mean reward, no training)."""

    path: str = Field(min_length=1, description="a .jsonl / .parquet file or a datasets directory")
    prompt_field: str | None = Field(default=None, description="column holding the prompt (default: data.prompt_field)")
    split: str = Field(default="test", description="split to read when the directory holds several")


class RewardConfig(StrictModel):
    function: str = Field(
        min_length=3, description="'package.module:function' or 'path/to/file.py:function' (TRL GRPOTrainer signature)"
    )
    weight: float = Field(default=1.0, description="weight of this function in the job's reward (weighted sum)")


class DataError(ValueError):
    """Bad data input: ``field`` is the config key (relative to the job), the message says what and how to fix."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


# ------------------------------------------------------------------ reading


@dataclass(frozen=True, kw_only=True)
class Rows:
    """A dataset read into memory: column names and rows in file order."""

    source: str
    columns: tuple[str, ...]
    rows: tuple[dict, ...]


def read_rows(path: str, split: str, field: str = "path") -> Rows:
    """Read ``path``; raise :class:`DataError` (on ``field``) if it is missing, unreadable or malformed."""
    p = Path(path)
    st = p.stat() if p.exists() else None
    try:
        return _read_cached(str(p.resolve()), split, st.st_mtime_ns if st else 0, field)
    except DataError as exc:
        raise DataError(exc.field, exc.args[0].replace(str(p.resolve()), path)) from None


@lru_cache(maxsize=16)
def _read_cached(path: str, split: str, _mtime: int, field: str) -> Rows:
    p = Path(path)
    if not p.exists():
        raise DataError(field, f"{path}: no such file or directory; give a .jsonl or .parquet file or a datasets directory")
    if p.is_dir():
        ds = _load_dir(p, split, field)
    elif not p.is_file():  # a pipe or a device: reading it could wait for ever
        raise DataError(field, f"{path}: not a regular file; give a .jsonl or .parquet file or a datasets directory")
    elif p.suffix in (".jsonl", ".ndjson", ".json"):
        ds = _from_list(_jsonl(p, field), path, field)
    elif p.suffix == ".parquet":
        ds = _load_parquet(p, field)
    else:
        raise DataError(field, f"{path}: unknown format '{p.suffix}'; use .jsonl, .parquet or a datasets save_to_disk directory")
    if len(ds) == 0:
        raise DataError(field, f"{path}: the dataset is empty; give a file with at least one row")
    return Rows(source=path, columns=tuple(ds.column_names), rows=tuple(ds.to_list()))


def _jsonl(p: Path, field: str) -> list[dict]:
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(field, f"{p}: cannot be read ({type(exc).__name__}); check the file and its permissions") from None
    if p.suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DataError(field, f"{p} line {exc.lineno} is not valid JSON ({exc.msg}); fix that line") from None
        except RecursionError:
            raise DataError(field, f"{p} is nested too deep to read; flatten its rows") from None
        except ValueError:
            raise DataError(field, f"{p}: {TOO_MANY_DIGITS}") from None
        numbered = list(enumerate(rows, 1))
    else:
        numbered = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                numbered.append((n, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise DataError(field, f"{p} line {n} is not valid JSON ({exc.msg}); fix that line") from None
            except RecursionError:
                raise DataError(field, f"{p} line {n} is nested too deep to read; flatten it") from None
            except ValueError:
                raise DataError(field, f"{p} line {n}: {TOO_MANY_DIGITS}") from None
    for n, row in numbered:
        if not isinstance(row, dict):
            raise DataError(field, f"{p} line {n} is a JSON {type(row).__name__}, not an object; write one object per line")
    return [row for _, row in numbered]


def _quiet():
    try:
        import datasets
    except ImportError:
        raise DataError("path", "reading data needs the datasets package (in the exec extra); pip install -e '.[exec]'") from None

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    return datasets


def _from_list(rows: list[dict], path: str, field: str):
    datasets = _quiet()
    try:
        return datasets.Dataset.from_list(rows)
    except Exception as exc:  # pyarrow: a column whose rows disagree on type
        raise DataError(
            field,
            f"{path}: rows disagree on a column's type ({type(exc).__name__}: {' '.join(str(exc).split())[:160]}); make each "
            "column one type",
        ) from None


def _load_parquet(p: Path, field: str):
    datasets = _quiet()
    import pyarrow.parquet as pq
    from datasets.table import InMemoryTable

    try:
        return datasets.Dataset(InMemoryTable(pq.read_table(p)))  # in memory: no cache files written
    except Exception as exc:
        raise DataError(field, f"{p}: not a readable Parquet file ({type(exc).__name__}); check the file") from None


def _load_dir(p: Path, split: str, field: str):
    datasets = _quiet()
    try:
        ds = datasets.load_from_disk(str(p))
    except Exception as exc:
        raise DataError(
            field,
            f"{p}: not a datasets directory ({type(exc).__name__}); save it with Dataset.save_to_disk, or give a .jsonl / "
            ".parquet file",
        ) from None
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError("split", f"{p} has no split '{split}' (it has {', '.join(sorted(ds))}); set split to one of them")
        ds = ds[split]
    return ds


def is_messages(value: object) -> bool:
    """A conversational prompt: a list of ``{"role", "content"}`` messages (TRL's conversational format)."""
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and "role" in m and "content" in m for m in value)


def check_rows(rows: Rows, prompt_field: str, field: str = "prompt_field") -> tuple[str, ...]:
    """The prompt field exists and holds text or messages on every row; returns the other columns."""
    if prompt_field not in rows.columns:
        raise DataError(
            field,
            f"'{prompt_field}' is not a column of {rows.source} (columns: {', '.join(rows.columns)}); set prompt_field to the "
            "prompt's column",
        )
    for i, row in enumerate(rows.rows):
        v = row[prompt_field]
        if not (isinstance(v, str) or is_messages(v)):
            raise DataError(
                field,
                f"row {i + 1} of {rows.source}: '{prompt_field}' holds {type(v).__name__}, not text or a list of chat "
                "messages; fix the row",
            )
    if rows.rows and all(isinstance(row[prompt_field], str) and not row[prompt_field].strip() for row in rows.rows):
        raise DataError(
            field,
            f"every row of {rows.source} has an empty '{prompt_field}'; set prompt_field to the column that holds the prompts",
        )
    others = tuple(c for c in rows.columns if c != prompt_field)
    for c in others:
        if c in TRL_ARGS:
            raise DataError(
                "path",
                f"column '{c}' of {rows.source} has the name of a reward argument ({', '.join(TRL_ARGS)}); rename the column",
            )
    return others


# ------------------------------------------------------------------ prompts


@dataclass(frozen=True, kw_only=True)
class PromptItem:
    """One prompt as the job uses it: token ids for rollout; the prompt and its row's other columns for the rewards."""

    row: int  # index of the row in its dataset
    prompt: object  # text, or a list of chat messages, exactly as in the data
    prompt_ids: tuple[int, ...]
    columns: tuple[tuple[str, object], ...]  # (column, value) for every other column of the row


@dataclass(frozen=True, kw_only=True)
class PreparedPrompts:
    source: str
    items: tuple[PromptItem, ...]
    rows: int  # rows read
    too_long: int  # left out: prompt + max_new_tokens over the model's limit
    limit: int  # the model's limit (tokens per sequence)
    lost_prompts: int = 0  # kept prompts with characters the tokenizer cannot represent (its unknown token)
    lost_chars: int = 0  # unknown tokens in them (characters, for the built-in tokenizer)


class Encoder:
    """The checkpoint's own tokenizer: chat template when it has one (and it is wanted), else the text as is."""

    def __init__(self, model_dir: str | Path, chat_template: bool) -> None:
        from rlix.exec.data.model import load_tokenizer

        self.tok = load_tokenizer(model_dir)
        self.templated = bool(chat_template and getattr(self.tok, "chat_template", None))
        self.unk_id = self.tok.unk_token_id  # None: every character has a token (byte-level tokenizers)

    def encode(self, prompt: object) -> tuple[int, ...]:
        if self.templated:
            messages = prompt if is_messages(prompt) else [{"role": "user", "content": prompt}]
            ids = self.tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            return tuple(int(t) for t in ids)
        if is_messages(prompt):
            raise DataError(
                "chat_template",
                "the prompts are chat messages but the tokenizer has no chat template (or chat_template is false); give text "
                "prompts or a checkpoint with a chat template",
            )
        ids = list(self.tok(prompt, add_special_tokens=True)["input_ids"])
        bos = self.tok.bos_token_id
        if bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)  # a BOS the tokenizer defines but its post-processor does not add
        return tuple(ids)


def model_limit(model_dir: str | Path, override: int | None = None) -> int:
    """Tokens per sequence (prompt + completion) the model takes: its config's limit, or ``override``."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    limit = cfg.get("max_position_embeddings") or cfg.get("n_positions") or 1 << 30
    return min(limit, override) if override else int(limit)


def prepare(rows: Rows, prompt_field: str, encoder: Encoder, *, limit: int, max_new_tokens: int) -> PreparedPrompts:
    """Tokenize every row's prompt; leave out (and count) those that do not fit ``limit`` with the completion budget.

    Kept prompts with characters the tokenizer has no token for are kept as encoded (the unknown token
    in their place) and counted.
    """
    items = []
    too_long = lost_prompts = lost_chars = 0
    for i, row in enumerate(rows.rows):
        ids = encoder.encode(row[prompt_field])
        if not ids or len(ids) + max_new_tokens > limit:
            too_long += 1
            continue
        unknown = ids.count(encoder.unk_id) if encoder.unk_id is not None else 0
        lost_prompts, lost_chars = lost_prompts + (unknown > 0), lost_chars + unknown
        cols = tuple((c, row[c]) for c in rows.columns if c != prompt_field)
        items.append(PromptItem(row=i, prompt=row[prompt_field], prompt_ids=ids, columns=cols))
    return PreparedPrompts(
        source=rows.source,
        items=tuple(items),
        rows=len(rows.rows),
        too_long=too_long,
        limit=limit,
        lost_prompts=lost_prompts,
        lost_chars=lost_chars,
    )


class DatasetPrompts:
    """Each step's prompts: the rows in an order shuffled by the seed, a new order each epoch, cycling."""

    def __init__(self, prepared: PreparedPrompts, seed: int) -> None:
        if not prepared.items:
            raise DataError(
                "path",
                f"{prepared.source}: all {prepared.rows} prompts are longer than the model's limit of {prepared.limit} tokens "
                "with max_new_tokens; shorten them or lower max_new_tokens",
            )
        self.items = prepared.items
        self.seed = seed
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            order = list(range(len(self.items)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._orders = {epoch: order}  # steps move forward: keep one epoch's order
        return self._orders[epoch]

    def batch(self, step: int, n: int, rng: random.Random | None = None) -> list[PromptItem]:
        """The ``n`` prompts of ``step`` (a pure function of seed, step and n; ``rng`` is not used)."""
        size = len(self.items)
        out = []
        for k in range(step * n, step * n + n):
            out.append(self.items[self._order(k // size)[k % size]])
        return out
