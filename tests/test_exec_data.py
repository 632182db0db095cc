"""Jobs from the user's data and reward functions, without Ray: TRL reward forms, data reading, bad input."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from helpers import assert_config_error_names

from rlix.exec.data.rewards import RewardError, RewardRef, RewardSet
from rlix.exec.data.sources import DatasetPrompts, PreparedPrompts, PromptItem, check_rows, read_rows
from rlix.exec.deadline import on_daemon_thread

pytestmark = pytest.mark.exec  # reads data with the datasets package (exec extra); no Ray, no torch

ROOT = Path(__file__).resolve().parent.parent
TRL = "tests/data/trl_rewards.py"


def _set(*names_weights, base=str(ROOT)) -> RewardSet:
    return RewardSet(tuple(RewardRef(function=f"{TRL}:{n}", weight=w, base_dir=base) for n, w in names_weights))


def _score(rs: RewardSet, completions, **columns):
    prompts = columns.pop("prompts", ["12="] * len(completions))
    ids = columns.pop("completion_ids", [[5] * len(c) for c in completions])
    return rs.score(completions=completions, prompts=prompts, completion_ids=ids, columns=columns)


def test_a_function_holding_the_interpreter_lock_stops_nothing_of_its_caller_and_is_named_at_its_deadline(tmp_path):
    """Before: the functions ran in the job's coordinator, so one stuck in C with the interpreter lock held
    stopped every thread there: the job's deadline could not fire (the call returned when the C code did),
    nor could the job answer the scheduler, which ended it as unreachable with no word of why."""
    rs = _set(("holds_the_lock", 1.0))
    ticks, stop = [], threading.Event()
    ticker = threading.Thread(target=lambda: [ticks.append(1) for _ in iter(lambda: stop.wait(0.05), True)], daemon=True)
    ticker.start()
    scoring = on_daemon_thread(lambda: _score(rs, ["x"]), "rlix-score")
    with pytest.raises(concurrent.futures.TimeoutError):
        scoring.result(timeout=3.0)
    error = rs.unfinished(3.0)
    stop.set()
    stuck = (ROOT / TRL).read_text().splitlines().index('    re.match(r"(a+)+$", "a" * 29 + "!")') + 1
    assert str(error) == (
        f"reward function {TRL}:holds_the_lock did not return within 3 s (limits.reward_timeout_s) at {ROOT / TRL}:{stuck}"
    )
    assert len(ticks) >= 20  # this process's threads ran all along
    assert f'  File "{ROOT / TRL}", line {stuck}\n    re.match(r"(a+)+$", "a" * 29 + "!")\n' in error.details
    kept = error.kept_in(tmp_path)  # the job's reward_error.txt: where it was stuck, as a traceback reads
    assert kept == f"{error}; traceback in {tmp_path / 'reward_error.txt'}"
    with pytest.raises(RewardError, match="reward functions' process"):  # its process was ended
        scoring.result(timeout=10)


def test_what_the_functions_print_goes_to_the_log_and_a_process_that_dies_names_it(tmp_path):
    log = tmp_path / "job" / "rewards.log"  # its folder made when the process starts
    rs = _set(("prints", 1.0))
    rs.start(log)
    try:
        _score(rs, ["a", "b"])
        _score(rs, ["c"])
        assert log.read_text().splitlines() == ["scoring 2 completions", "scoring 1 completions"]  # as printed
    finally:
        rs.close()
    dying = _set(("dies", 1.0))
    dying.start(log)  # a second process appends
    with pytest.raises(RewardError, match=f"exited with status 7; its output is in {log}$"):
        _score(dying, ["x"])
    assert log.read_text().splitlines() == ["scoring 2 completions", "scoring 1 completions", "going"]


def test_an_ended_reward_process_answers_its_waiting_call_and_starts_no_other():
    rs = _set(("hangs", 1.0))
    scoring = on_daemon_thread(lambda: _score(rs, ["x"]), "rlix-score")
    with pytest.raises(concurrent.futures.TimeoutError):
        scoring.result(timeout=1.0)  # it hangs
    rs.end()
    with pytest.raises(RewardError, match="reward functions' process"):
        scoring.result(timeout=10)
    with pytest.raises(RewardError, match="^the reward functions' process was ended$"):
        _score(rs, ["y"])  # none starts again


# ------------------------------------------------------------------ TRL reward forms


def test_trl_forms_run_unchanged():
    rs = _set(("reward_len", 1.0), ("match_answer", 1.0), ("echoes_prompt", 1.0), ("short_ids", 1.0))
    out = _score(
        rs, ["12", "123", "9"], answer=["12", "0", "9"], prompts=["12=", "123=", "4="], completion_ids=[[1, 2], [1, 2, 3], [4]]
    )
    by = {f.name.rpartition(":")[2]: f.values for f in out.functions}
    assert by["reward_len"] == (-1.0, 0.0, -2.0)
    assert by["match_answer"] == (1.0, 0.0, 1.0)
    assert by["echoes_prompt"] == (1.0, 1.0, 0.0)
    assert by["short_ids"] == (1.0, 0.0, 1.0)
    assert out.totals == (2.0, 1.0, 0.0)


def test_module_reference_and_conversational_completions():
    rs = RewardSet((RewardRef(function="trl_rewards:think_format", base_dir=str(ROOT / "tests" / "data")),))
    conv = [[{"role": "assistant", "content": "<think>x</think>7"}], [{"role": "assistant", "content": "7"}]]
    assert _score(rs, conv).totals == (1.0, 0.0)


def test_weighted_sum_and_none_counts_zero():
    rs = _set(("match_answer", 2.0), ("only_sub", 0.5))
    out = _score(rs, ["1", "2", "3"], answer=["1", "x", "3"], op=["add", "sub", "sub"])
    assert out.totals == (2.0, 0.5, 2.5)
    only_sub = out.functions[1]
    assert only_sub.values == (None, 1.0, 1.0) and only_sub.nones == 1 and only_sub.mean == 1.0


def test_nan_is_no_opinion():
    out = _score(_set(("nan_is_none", 1.0)), ["a", "b"])
    assert out.functions[0].values == (None, 1.0) and out.totals == (0.0, 1.0)


@pytest.mark.parametrize(
    "name, words",
    [
        ("infinite", ["infinite", "finite floats"]),
        ("raises", ["trl_rewards.py:raises", "raised ValueError", "bad thing"]),
        ("too_few", ["too_few", "returned 1 values for 3"]),
        ("by_index", ["by_index", "returned a dict, not a list of 3 floats"]),
        ("not_numbers", ["not_numbers", "'high'"]),
    ],
)
def test_failing_function_is_named_in_one_line(name, words):
    with pytest.raises(RewardError) as info:
        _score(_set((name, 1.0)), ["a", "b", "c"])
    msg = str(info.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_a_raise_names_the_users_line_and_its_traceback_is_kept(tmp_path):
    """A raise deep in the standard library is placed at the user's line that called it."""
    with pytest.raises(RewardError) as info:
        _score(_set(("reward_len", 1.0), ("parses_json", 1.0)), ["1", "x"])
    source = (ROOT / TRL).read_text().splitlines()
    lineno = source.index("    return [float(json.loads(c)) for c in completions]") + 1
    exc = info.value
    assert exc.index == 1 and str(exc).endswith(
        f"raised JSONDecodeError: Expecting value: line 1 column 1 (char 0) at {ROOT / TRL}:{lineno}"
    )
    line = exc.kept_in(tmp_path / "job")
    assert line == f"{exc}; traceback in {tmp_path / 'job' / 'reward_error.txt'}"
    kept = (tmp_path / "job" / "reward_error.txt").read_text()
    assert f"line {lineno}, in parses_json" in kept and "json/decoder.py" in kept and kept.count("\n") > 6
    assert exc.kept_in(None) == str(exc)  # no job directory: the line alone


def test_a_bad_value_has_no_traceback_to_keep(tmp_path):
    with pytest.raises(RewardError) as info:
        _score(_set(("reward_len", 1.0), ("too_few", 1.0)), ["a", "b"])
    assert info.value.index == 1 and info.value.kept_in(tmp_path) == str(info.value)
    assert not (tmp_path / "reward_error.txt").exists()


def test_reward_set_pickles_by_reference():
    import pickle

    rs = _set(("reward_len", 1.0))
    _score(rs, ["abc"])
    again = pickle.loads(pickle.dumps(rs))
    assert _score(again, ["abcd"]).totals == (-1.0,)


# ------------------------------------------------------------------ reading data


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


ROWS = [{"q": f"{i}+1=", "answer": str(i + 1), "op": "add"} for i in range(5)]


def test_jsonl_parquet_and_datasets_dir_read_the_same(tmp_path):
    import datasets

    ds = datasets.Dataset.from_list(ROWS)
    ds.to_parquet(str(tmp_path / "d.parquet"))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(2))}).save_to_disk(str(tmp_path / "dd"))
    ds.save_to_disk(str(tmp_path / "single"))
    reads = [
        read_rows(str(_write_jsonl(tmp_path / "d.jsonl", ROWS)), "train"),
        read_rows(str(tmp_path / "d.parquet"), "train"),
        read_rows(str(tmp_path / "dd"), "train"),
        read_rows(str(tmp_path / "single"), "anything"),
    ]
    for r in reads:
        assert r.rows == tuple(ROWS) and check_rows(r, "q") == ("answer", "op")
    assert len(read_rows(str(tmp_path / "dd"), "test").rows) == 2


def _items(n: int) -> PreparedPrompts:
    items = tuple(PromptItem(row=i, prompt=f"p{i}", prompt_ids=(1, i), columns=()) for i in range(n))
    return PreparedPrompts(source="x", items=items, rows=n, too_long=0, limit=64)


def test_prompts_are_shuffled_by_seed_and_cycle_epochs():
    src = DatasetPrompts(_items(10), seed=3)
    first = [it.row for step in range(5) for it in src.batch(step, 4)]  # 20 prompts = two epochs
    assert sorted(first[:10]) == list(range(10)) and sorted(first[10:]) == list(range(10))
    assert first[:10] != list(range(10)) and first[:10] != first[10:]
    assert [it.row for it in DatasetPrompts(_items(10), seed=3).batch(3, 4)] == first[12:16]  # a pure function of the step
    assert [it.row for it in DatasetPrompts(_items(10), seed=4).batch(0, 10)] != first[:10]


def test_eval_runs_every_eval_every_steps_and_on_the_last():
    from rlix.exec.data.recipe import Recipe

    def recipe(steps: int) -> Recipe:
        return Recipe(
            source=DatasetPrompts(_items(10), seed=0),
            rewards=_set(("match_answer", 1.0)),
            codec=None,
            prompts_per_step=2,
            group_size=2,
            max_new_tokens=4,
            temperature=1.0,
            seed=0,
            eval_source=DatasetPrompts(_items(3), seed=0),
            eval_every=4,
            last_step=steps - 1,
        )

    ten, nine = recipe(10), recipe(9)
    assert [s for s in range(10) if ten.is_eval_step(s)] == [0, 4, 8, 9]  # steps 1, 5, 9 and the last, 10
    assert [s for s in range(9) if nine.is_eval_step(s)] == [0, 4, 8]  # the last is one of them already
    assert [sum(t.eval for t in ten.trajectories(s)) for s in (8, 9)] == [3, 3]
    assert ten.step_size(9) == len(ten.trajectories(9)) == 2 * 2 + 3  # what the machine is told to expect


# ------------------------------------------------------------------ bad input, before any actor


def _data_cfg(tmp_path: Path, **job) -> dict:
    data = tmp_path / "train.jsonl"
    if not data.exists():
        _write_jsonl(data, ROWS)
    base = {
        "name": "arith",
        "model": {"size": {"seed": 0}},
        "data": {"path": str(data), "prompt_field": "q"},
        "rewards": [{"function": f"{ROOT / TRL}:match_answer", "weight": 1.0}],
        "roles": {"actor_train": {"gpus": [0]}, "actor_infer": {"gpus": [0]}},
    }
    base.update(job)
    return {"cluster": {"nodes": 1, "gpus_per_node": 1}, "jobs": [{k: v for k, v in base.items() if v is not None}]}


def _fn(name: str) -> list[dict]:
    return [{"function": f"{ROOT / TRL}:{name}"}]


BAD = [
    ("missing file", lambda d: {"data": {"path": str(d / "nope.jsonl")}}, "jobs[0].data.path", "no such file"),
    (
        "not json",
        lambda d: {"data": {"path": str(_bad_json(d)), "prompt_field": "q"}},
        "jobs[0].data.path",
        "line 2 is not valid JSON",
    ),
    (
        "unreadable parquet",
        lambda d: {"data": {"path": str(_touch(d / "x.parquet", "xx"))}},
        "jobs[0].data.path",
        "not a readable Parquet",
    ),
    (
        "not a dataset dir",
        lambda d: {"data": {"path": str(_mkdir(d / "empty"))}},
        "jobs[0].data.path",
        "not a datasets directory",
    ),
    ("empty", lambda d: {"data": {"path": str(_touch(d / "e.jsonl", "\n"))}}, "jobs[0].data.path", "empty"),
    (
        "every prompt empty",  # before: it trained on, every reward 0
        lambda d: {"data": {"path": str(_touch(d / "blank.jsonl", '{"q": ""}\n{"q": "  "}\n')), "prompt_field": "q"}},
        "jobs[0].data.prompt_field",
        "has an empty 'q'; set prompt_field to the column that holds the prompts",
    ),
    (
        "missing prompt field",
        lambda d: {"data": {"path": str(d / "train.jsonl"), "prompt_field": "question"}},
        "jobs[0].data.prompt_field",
        "'question' is not a column",
    ),
    (
        "eval missing field",
        lambda d: {"eval": {"path": str(d / "train.jsonl"), "prompt_field": "nope"}},
        "jobs[0].eval.prompt_field",
        "'nope'",
    ),
    (
        "module does not import",
        lambda d: {"rewards": [{"function": "no_such_pkg.mod:fn"}]},
        "jobs[0].rewards[0].function",
        "cannot import module",
    ),
    (
        "file does not import",
        lambda d: {"rewards": [{"function": f"{ROOT}/tests/data/broken_import.py:fn"}]},
        "jobs[0].rewards[0].function",
        "fails to import",
    ),
    (
        "file exits as it imports",
        lambda d: {"rewards": [{"function": f"{ROOT}/tests/data/exits_at_import.py:fn"}]},
        "jobs[0].rewards[0].function",
        "fails to import (SystemExit: 1)",
    ),
    ("no such file", lambda d: {"rewards": [{"function": "nope/r.py:fn"}]}, "jobs[0].rewards[0].function", "no file"),
    (
        "not a python file",  # it crashed: Python's importer gives no loader for a .jsonl
        lambda d: {"rewards": [{"function": f"{_touch(d / 'r.jsonl', '{}')}:fn"}]},
        "jobs[0].rewards[0].function",
        "is not a Python (.py) file",
    ),
    (
        "rows nested too deep",
        lambda d: {"data": {"path": str(_touch(d / "deep.jsonl", "[" * 100_000 + "]" * 100_000 + "\n")), "prompt_field": "q"}},
        "jobs[0].data.path",
        "nested too deep to read",
    ),
    ("no such function", lambda d: {"rewards": _fn("nope")}, "jobs[0].rewards[0].function", "has no attribute 'nope'"),
    ("not callable", lambda d: {"rewards": _fn("NOT_CALLABLE")}, "jobs[0].rewards[0].function", "not callable"),
    ("not a reference", lambda d: {"rewards": [{"function": "justaname"}]}, "jobs[0].rewards[0].function", "not a reference"),
    (
        "positional signature",
        lambda d: {"rewards": _fn("positional_only")},
        "jobs[0].rewards[0].function",
        "cannot take TRL's arguments",
    ),
    ("no **kwargs", lambda d: {"rewards": _fn("no_kwargs")}, "jobs[0].rewards[0].function", "cannot take TRL's arguments"),
    ("column it needs is absent", lambda d: {"rewards": _fn("needs_missing_column")}, "jobs[0].rewards[0].function", "solution"),
    ("both task and data", lambda d: {"task": {"name": "copy"}}, "jobs[0]", "both 'task' and 'data'"),
    ("neither", lambda d: {"data": None, "rewards": None}, "jobs[0]", "neither 'task' nor 'data'"),
    ("data without rewards", lambda d: {"rewards": None}, "jobs[0]", "'data' and 'rewards' go together"),
]


def _bad_json(d: Path) -> Path:
    return _touch(d / "bad.jsonl", '{"q": "1=", "answer": "1"}\n{"q": "2=", "answer": \n')


def _touch(p: Path, text: str) -> Path:
    p.write_text(text)
    return p


def _mkdir(p: Path) -> Path:
    p.mkdir()
    return p


@pytest.mark.parametrize("case, edit, field, words", BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_line_naming_job_and_field(tmp_path, case, edit, field, words):
    raw = _data_cfg(tmp_path)
    job = raw["jobs"][0]
    for k, v in edit(tmp_path).items():
        if v is None:
            job.pop(k, None)
        elif isinstance(v, dict) and isinstance(job.get(k), dict):
            job[k] = {**job[k], **v}
        else:
            job[k] = v
    from rlix.exec.config import ConfigError, parse_config

    assert_config_error_names(raw, field)
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert words in str(info.value)
    if field != "jobs[0]":
        assert "job 'arith'" in str(info.value)


def test_a_checkpoint_whose_config_json_is_not_json_is_refused_before_any_actor(tmp_path):
    from rlix.exec.config import ConfigError, parse_config

    ckpt = _mkdir(tmp_path / "ckpt")
    _touch(ckpt / "config.json", "{garbage")
    raw = _data_cfg(tmp_path, model={"path": str(ckpt)})
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert str(info.value) == (
        f"jobs[0].model: {ckpt / 'config.json'} is not a readable JSON file (JSONDecodeError); save the checkpoint again"
    )


def test_a_checkpoint_without_a_tokenizer_is_refused_before_any_actor(tmp_path):
    """Before, a task job on such a checkpoint failed at run time, on its first tokenized prompt."""
    from rlix.exec.config import ConfigError, parse_config

    ckpt = _mkdir(tmp_path / "ckpt")
    _touch(ckpt / "config.json", "{}")
    raw = _data_cfg(tmp_path, model={"path": str(ckpt)})
    # before: a checkpoint with no weights failed at model load, after Ray started, with a traceback
    with pytest.raises(ConfigError, match="has no weights .*; save them beside config.json: model.save_pretrained"):
        parse_config(raw)
    _touch(ckpt / "consolidated.safetensors", "")
    _touch(ckpt / "config.json", '{"transformers_weights": "consolidated.safetensors"}')  # a file config.json names
    with pytest.raises(ConfigError, match="has no tokenizer"):
        parse_config(raw)
    _touch(ckpt / "config.json", "{}")
    _touch(ckpt / "model.safetensors.index.json", "{}")  # sharded weights: the index names the shards
    with pytest.raises(ConfigError, match="has no tokenizer .*; save the model's tokenizer beside it"):
        parse_config(raw)
    _touch(ckpt / "tokenizer_config.json", "{}")
    assert parse_config(raw).jobs[0].model.path == str(ckpt)


def test_good_data_config_parses(tmp_path):
    from rlix.exec.config import parse_config

    cfg = parse_config(_data_cfg(tmp_path, eval={"path": str(tmp_path / "train.jsonl")}))
    assert cfg.jobs[0].data.prompt_field == "q" and cfg.jobs[0].task is None


def test_example_config_validates():
    from rlix.exec.config import load_config

    cfg = load_config(ROOT / "examples" / "cpu_data.yaml")
    assert {j.name for j in cfg.jobs} == {"arith", "copy"}


@pytest.mark.parametrize("which", ["bad json", "bad reward"])
def test_cli_refuses_bad_data_with_exit_2(tmp_path, which):
    raw = _data_cfg(tmp_path)
    if which == "bad json":
        raw["jobs"][0]["data"]["path"] = str(_bad_json(tmp_path))
    else:
        raw["jobs"][0]["rewards"] = _fn("no_kwargs")
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    proc = subprocess.run(
        [sys.executable, "-m", "rlix.exec.front.cli", str(path)], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "jobs[0]." in lines[0] and "arith" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_exit_status_2_when_a_job_failed_on_its_reward_function(capsys):
    from rlix.exec.front.cli import exit_status
    from rlix.exec.messages import JobResult
    from rlix.exec.records import JobStatus

    ok = JobResult(pipeline_id="copy", status=JobStatus.FINISHED)
    crashed = JobResult(pipeline_id="x", status=JobStatus.FAILED, error="ActorDiedError")
    bad = JobResult(
        pipeline_id="arith",
        status=JobStatus.FAILED,
        error="RewardError: reward function f.py:g raised KeyError: 'a'",
        bad_input=True,
    )
    assert exit_status({"copy": ok}) == 0
    assert exit_status({"copy": ok, "x": crashed}) == 1
    capsys.readouterr()
    assert exit_status({"copy": ok, "x": crashed, "arith": bad}) == 2
    assert capsys.readouterr().err == "rlix-run: job arith: RewardError: reward function f.py:g raised KeyError: 'a'\n"


def test_exit_status_says_a_cancel_and_a_stopped_scheduler_apart_and_names_who_asked(capsys):
    from rlix.exec.front.cli import exit_status
    from rlix.exec.messages import JobResult
    from rlix.exec.records import JobStatus
    from rlix.protocol import Stopped

    ok = JobResult(pipeline_id="copy", status=JobStatus.FINISHED)
    by_hand = Stopped(by="ann@head")
    cancelled = JobResult(pipeline_id="x", status=JobStatus.CANCELLED, error=by_hand.line(), stopped=by_hand)
    halted = Stopped(by="bob@head", scheduler_stopped=True)
    stopped = JobResult(pipeline_id="y", status=JobStatus.CANCELLED, error=halted.line(), stopped=halted)
    crashed = JobResult(pipeline_id="z", status=JobStatus.FAILED, error="ActorDiedError")
    assert exit_status({"copy": ok, "x": cancelled}) == 3
    assert capsys.readouterr().err == "rlix-run: job x: cancelled by ann@head\n"
    assert exit_status({"copy": ok, "x": cancelled, "y": stopped}) == 4
    assert capsys.readouterr().err.splitlines()[-1] == "rlix-run: job y: the rlix scheduler was stopped by bob@head"
    assert exit_status({"x": cancelled, "y": stopped, "z": crashed}) == 1  # a failure says the most


def test_a_pipe_as_the_data_path_is_refused_not_read_for_ever(tmp_path):
    import os

    from rlix.exec.data.sources import DataError, read_rows

    fifo = tmp_path / "rows.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="rows.jsonl: not a regular file; give a .jsonl or .parquet file"):
        read_rows(str(fifo), "train")
