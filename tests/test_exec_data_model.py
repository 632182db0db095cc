"""A data job's recipe with a real (tiny) checkpoint, without Ray: tokenizer, chat template, length filter,
eval scoring, the per-step metrics file and full-finetune checkpoints."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from rlix.exec.config import JobConfig

pytestmark = pytest.mark.exec

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from rlix.exec.data.model import ModelSize, build_model

    return build_model(
        ModelSize(arch="qwen2", hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tmp_path_factory.mktemp("m")
    )


def _job(tmp_path: Path, **extra) -> JobConfig:
    rows = [{"q": f"{i}{i}=", "answer": f"{i}{i}", "op": "add" if i % 2 else "sub"} for i in range(6)] + [
        {"q": "1" * 300 + "=", "answer": "1", "op": "add"}
    ]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    base = dict(
        name="j",
        model={"size": {"seed": 0}},
        data={"path": str(tmp_path / "d.jsonl"), "prompt_field": "q"},
        rewards=[
            {"function": f"{ROOT}/tests/data/trl_rewards.py:match_answer", "weight": 1.0},
            {"function": f"{ROOT}/tests/data/trl_rewards.py:only_sub", "weight": 0.5},
        ],
        prompts_per_step=2,
        group_size=3,
        max_new_tokens=4,
        roles={"actor_train": {"gpus": [0]}, "actor_infer": {"gpus": [0]}},
    )
    return JobConfig.model_validate({**base, **extra})


def test_text_prompts_use_the_checkpoints_tokenizer_and_long_ones_are_counted(tmp_path, model_dir):
    from rlix.exec.data.recipe import Recipe, TextCodec

    recipe = Recipe.from_data(_job(tmp_path), model_dir)
    train = recipe.report[0]
    assert (train.rows, len(train.items), train.too_long, train.limit) == (7, 6, 1, 256)
    item = train.items[0]
    assert item.prompt_ids == TextCodec(model_dir).encode_prompt(item.prompt)  # BOS + characters, as the built-in tasks encode
    assert dict(item.columns) == {"answer": "00", "op": "sub"}


def test_chat_template_applied_unless_disabled(tmp_path, model_dir):
    import shutil

    from rlix.exec.data.model import load_tokenizer
    from rlix.exec.data.sources import Encoder

    templated = tmp_path / "chat"
    shutil.copytree(model_dir, templated)
    tok = load_tokenizer(templated)
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}.{% endfor %}{% if add_generation_prompt %}a:{% endif %}"
    )
    tok.save_pretrained(str(templated))
    on, off = Encoder(templated, True), Encoder(templated, False)
    decode = lambda ids: tok.decode(list(ids), skip_special_tokens=True)
    assert decode(on.encode("12=")) == "u:12=.a:"
    assert decode(on.encode([{"role": "system", "content": "x"}, {"role": "user", "content": "1"}])) == "s:x.u:1.a:"
    assert decode(off.encode("12=")) == "12="
    assert not Encoder(model_dir, True).templated  # no template in the checkpoint: text as is


SPELL = "Spell the word 'apple' backwards:"


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_built_tokenizer_keeps_every_printable_ascii_character(tmp_path, arch):
    from rlix.exec.data.model import ModelSize, build_model
    from rlix.exec.data.recipe import TextCodec
    from rlix.exec.data.sources import Encoder

    d = build_model(ModelSize(arch=arch, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tmp_path)
    encoder, codec = Encoder(d, True), TextCodec(d)
    every = "".join(chr(c) for c in range(32, 127)) + "\n"
    for text in (SPELL, every):
        ids = encoder.encode(text)
        assert ids == codec.encode_prompt(text)  # the data path and the task path agree
        assert len(ids) == len(text) + 1 and encoder.unk_id not in ids  # BOS, then one token per character
        assert codec.decode(ids) == text and encoder.tok.decode(list(ids), skip_special_tokens=True) == text


def test_characters_outside_the_alphabet_are_counted_and_reported(tmp_path, model_dir, capsys):
    from rlix.exec.config import RunConfig
    from rlix.exec.front.api import data_report, prepare_recipes

    rows = [{"q": SPELL, "answer": "x"}, {"q": "Été 🙂 =", "answer": "y"}, {"q": "naïve", "answer": "z"}]
    (tmp_path / "u.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    job = _job(tmp_path, data={"path": str(tmp_path / "u.jsonl"), "prompt_field": "q"})
    job = job.model_copy(update={"rewards": job.rewards[:1]})
    cfg = RunConfig.model_validate({"cluster": {"nodes": 1, "gpus_per_node": 1}, "jobs": [job.model_dump()]})
    recipe = prepare_recipes(cfg, {"j": str(model_dir)})["j"]
    train = data_report(recipe)["train"]
    assert (train["prompts"], train["lost_prompts"], train["lost_chars"]) == (3, 2, 4)  # É, é, 🙂 and ï
    item = recipe.source.items[1]
    assert recipe.codec.decode(item.prompt_ids) == "t  ="  # each lost character a (skipped) unknown token, nothing shifted
    assert len(item.prompt_ids) == len(rows[1]["q"]) + 1
    err = capsys.readouterr().err
    assert err == (
        f"rlix-run: job j: 2 of 3 prompts in {tmp_path / 'u.jsonl'} have characters the tokenizer cannot represent "
        "(4 in all, each now its unknown token); see docs/executor.md on the built-in tokenizer's alphabet\n"
    )


def test_a_model_built_with_an_older_tokenizer_is_built_again(tmp_path):
    from rlix.exec.data.model import ModelSize, build_model, load_tokenizer

    size = ModelSize(arch="qwen2", hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
    build_model(size, tmp_path)
    marker = tmp_path / "rlix_size.json"
    marker.write_text(json.dumps(size.__dict__, sort_keys=True))  # what an older build left: no tokenizer version
    (tmp_path / "tokenizer_config.json").write_text("{}")
    build_model(size, tmp_path)
    assert json.loads(marker.read_text())["tokenizer"] == 2
    assert load_tokenizer(tmp_path).decode(load_tokenizer(tmp_path)(SPELL)["input_ids"]) == SPELL


def _raise_line(name: str) -> int:
    """The line of tests/data/trl_rewards.py where ``name`` raises."""
    lines = (ROOT / "tests" / "data" / "trl_rewards.py").read_text().splitlines()
    code = {
        "raises": 'raise ValueError("bad\\nthing")',
        "exits": "sys.exit(3)",
        "parses_json": "return [float(json.loads(c)) for c in completions]",
    }
    return lines.index("    " + code[name]) + 1 if name in code else 0


@pytest.mark.parametrize(
    "name, words",
    [
        ("raises", "raised ValueError: bad thing at {file}:{line}"),
        ("exits", "raised SystemExit: 3 at {file}:{line}"),
        ("parses_json", "raised JSONDecodeError: Expecting value: line 1 column 1 (char 0) at {file}:{line}"),
        ("too_few", "returned 1 values for 8 completions"),
        ("not_numbers", "returned 'high', not a number"),
        ("numeric_strings", "returned '1.0', not a number"),  # before: read as 1.0, where TRL refuses it
    ],
)
def test_reward_functions_are_tried_on_a_few_prompts_before_any_actor(tmp_path, model_dir, name, words):
    from rlix.exec.config import ConfigError, RunConfig
    from rlix.exec.front.api import prepare_recipes

    job = _job(tmp_path)
    rewards = [job.rewards[0], job.rewards[0].model_copy(update={"function": f"{ROOT}/tests/data/trl_rewards.py:{name}"})]
    cfg = RunConfig.model_validate(
        {"cluster": {"nodes": 1, "gpus_per_node": 1}, "jobs": [job.model_copy(update={"rewards": rewards}).model_dump()]}
    )
    with pytest.raises(ConfigError) as info:
        prepare_recipes(cfg, {"j": str(model_dir)})
    msg = str(info.value)
    assert msg.startswith(f"jobs[0].rewards[1].function: job 'j': reward function {ROOT}/tests/data/trl_rewards.py:{name} ")
    assert words.format(file=ROOT / "tests" / "data" / "trl_rewards.py", line=_raise_line(name)) in msg
    assert msg.endswith(
        ", on a dry run over the first 4 prompts with dummy completions (empty, and the prompt's own text); fix the function"
    )
    assert "\n" not in msg


def test_a_reward_function_that_does_not_return_on_the_dry_run_is_named_and_left_behind(tmp_path, model_dir, monkeypatch):
    """Before: a function that never returned (a judge that does not answer) held rlix-run before any actor, silently."""
    import rlix.exec.data.recipe as recipe_module
    from rlix.exec.config import ConfigError, RunConfig
    from rlix.exec.front.api import prepare_recipes

    monkeypatch.setattr(recipe_module, "DRY_TIMEOUT_S", 2.0)  # the functions' process starts within it
    job = _job(tmp_path)
    hangs = job.rewards[0].model_copy(update={"function": f"{ROOT}/tests/data/trl_rewards.py:hangs"})
    both = job.model_dump() | {"rewards": [job.rewards[0].model_dump(), hangs.model_dump()]}
    for limits, seconds in (({}, "2"), ({"reward_timeout_s": 1.5}, "1.5")):  # the job's own deadline, where it gives one
        cfg = RunConfig.model_validate({"cluster": {"nodes": 1, "gpus_per_node": 1}, "jobs": [both | {"limits": limits}]})
        t0 = time.monotonic()
        with pytest.raises(ConfigError) as info:
            prepare_recipes(cfg, {"j": str(model_dir)})
        assert time.monotonic() - t0 < 30
        stuck = (ROOT / "tests" / "data" / "trl_rewards.py").read_text().splitlines().index("    threading.Event().wait()") + 1
        assert str(info.value).startswith(
            f"jobs[0].rewards[1].function: job 'j': reward function {ROOT}/tests/data/trl_rewards.py:hangs did not return "
            f"within {seconds} s (limits.reward_timeout_s) at {ROOT}/tests/data/trl_rewards.py:{stuck}, on a dry run over "
            "the first 4 prompts"
        )


def test_a_ctrl_c_during_the_dry_run_stops_it_at_once(tmp_path, model_dir):
    """Before: the first Ctrl-C waited for the dry run to end (up to the job's reward deadline, an hour by
    default), then exited 2 with the function's error rather than 130."""
    from rlix.exec.config import RunConfig
    from rlix.exec.deadline import Interrupted
    from rlix.exec.front.api import prepare_recipes

    job = _job(tmp_path)
    hangs = job.rewards[0].model_copy(update={"function": f"{ROOT}/tests/data/trl_rewards.py:hangs"})
    limits = {"reward_timeout_s": 3600}
    cfg = RunConfig.model_validate(
        {
            "cluster": {"nodes": 1, "gpus_per_node": 1},
            "jobs": [job.model_dump() | {"rewards": [hangs.model_dump()], "limits": limits}],
        }
    )
    t0 = time.monotonic()
    with pytest.raises(Interrupted):
        prepare_recipes(cfg, {"j": str(model_dir)}, stop=lambda: time.monotonic() - t0 > 1.0)
    assert time.monotonic() - t0 < 30  # not the hour of its deadline: its process is killed (within a second of asking)
    with pytest.raises(Interrupted):  # a Ctrl-C before: no job's data is read
        prepare_recipes(cfg, {"j": "/nowhere"}, stop=lambda: True)


def test_rlix_run_stopped_by_ctrl_c_in_its_dry_run_exits_130_at_once(tmp_path):
    import signal
    import subprocess
    import sys

    import yaml

    job = _job(tmp_path).model_dump(mode="json", exclude_none=True)
    job["model"] = {"size": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}}
    job["rewards"] = [{"function": f"{ROOT}/tests/data/trl_rewards.py:says_then_hangs"}]
    raw = {"cluster": {"nodes": 1, "gpus_per_node": 1}, "output": {"dir": str(tmp_path / "out")}, "jobs": [job]}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    cmd = [sys.executable, "-m", "rlix.exec.front.cli", str(tmp_path / "c.yaml"), "--no-console"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    said = []
    for line in proc.stderr:  # the dry run's prints come to rlix-run's stderr
        said.append(line)
        if "scoring, for ever" in line:
            break
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rest = proc.stderr.read()
    assert proc.wait(timeout=60) == 130, "".join(said) + rest
    assert time.monotonic() - t0 < 10
    assert rest.strip().splitlines()[-1] == "rlix-run: stopped by Ctrl-C before any job started; nothing written"
    assert not (tmp_path / "out").exists()


def test_the_dry_run_gives_each_function_empty_and_echoed_completions(tmp_path, model_dir):
    from rlix.exec.data.recipe import Recipe

    seen = []
    recipe = Recipe.from_data(_job(tmp_path), model_dir)
    recipe.rewards.score = lambda **kw: seen.append(kw)  # the call the functions get, as TRL makes it
    recipe.dry_check()
    (call,) = seen
    assert call["completions"] == ["", "00=", "", "11=", "", "22=", "", "33="]  # the first 4 prompts, in file order
    assert call["prompts"] == ["00=", "00=", "11=", "11=", "22=", "22=", "33=", "33="]
    assert call["completion_ids"][:2] == [[], list(recipe.codec.encode_prompt("00=")[1:])]
    assert call["columns"]["answer"][:3] == ["00", "00", "11"]


def test_eval_trajectories_are_scored_apart_and_columns_reach_rewards(tmp_path, model_dir):
    from rlix.exec.data.recipe import Recipe
    from rlix.exec.rollout.torch_backend import GenResult

    job = _job(tmp_path, eval={"path": str(tmp_path / "d.jsonl")}, eval_every=2)
    recipe = Recipe.from_data(job, model_dir)
    codec = recipe.codec
    assert [sum(t.eval for t in recipe.trajectories(s)) for s in range(4)] == [6, 0, 6, 0]
    assert [recipe.step_size(s) for s in range(4)] == [
        len(recipe.trajectories(s)) for s in range(4)
    ]  # what a hand-back announces
    trajs = recipe.trajectories(0)
    ids = [t.request.traj_id for t in trajs]
    assert len(set(ids)) == len(ids) and not set(ids) & {t.request.traj_id for t in recipe.trajectories(1)}

    def answer(t):  # every train completion right; eval ones wrong
        text = "x" if t.eval else dict(t.prompt.columns)["answer"]
        toks = codec.encode_prompt(text)[1:]
        return GenResult(
            traj_id=t.request.traj_id,
            token_ids=toks,
            logprobs=(0.0,) * len(toks),
            finished=True,
            aborted=False,
            weight_version=0,
            gen_s=0.0,
        )

    scored = recipe.score(trajs, {t.request.traj_id: answer(t) for t in trajs})
    assert len(scored.samples) == job.batch_size
    ops = [dict(t.prompt.columns)["op"] for t in trajs if not t.eval]
    assert list(scored.rewards) == [1.0 + (0.5 if o == "sub" else 0.0) for o in ops]
    assert scored.eval.prompts == 6 and scored.eval.mean_reward == pytest.approx(0.5 * 3 / 6)
    assert scored.functions[1].nones == ops.count("add")


def test_a_step_line_that_cannot_be_written_fails_no_training_and_the_next_one_tries_again(tmp_path):
    """Before: the job's folder gone mid-run made its TensorBoard write raise, and the job failed."""
    from rlix.exec.data.recipe import ScoredStep
    from rlix.exec.job.steplog import StepLog
    from rlix.exec.train.grpo import TrainStats

    log = StepLog(tmp_path / "job")
    stats = TrainStats(loss=0.5, kl=0.01, clip_fraction=0.0, tokens=9, seconds=1.0)
    step = {"stream": "", "scored": ScoredStep(samples=(), rewards=(1.0,)), "train": stats, "tokens": [2], "staleness": 0}
    log.write(t=1.0, step=1, step_s=1.0, **step)
    (tmp_path / "job").rename(tmp_path / "moved")
    (tmp_path / "job").write_text("")  # a file where the folder was
    log.close()  # its open file would still write into the moved folder: the next line opens the path anew
    assert log.write(t=2.0, step=2, step_s=1.0, **step)["step"] == 2
    assert log.problem == (f"its step 2 metrics could not be written to {tmp_path / 'job'} (FileExistsError: File exists)")
    (tmp_path / "job").unlink()
    log.write(t=3.0, step=3, step_s=1.0, **step)  # the folder is back: written again, the first problem kept
    log.close()
    assert [json.loads(x)["step"] for x in (tmp_path / "job" / "metrics.jsonl").read_text().splitlines()] == [3]
    assert log.problem.startswith("its step 2 metrics")


def test_a_line_cut_short_or_a_folder_removed_loses_no_later_line(tmp_path):
    """A line the disk cut short left the next one appended to it, both unreadable; a removed folder kept
    the open file writing into nothing."""
    from rlix.exec.data.recipe import ScoredStep
    from rlix.exec.job.steplog import StepLog, read_lines
    from rlix.exec.train.grpo import TrainStats

    stats = TrainStats(loss=0.5, kl=0.01, clip_fraction=0.0, tokens=9, seconds=1.0)
    step = {"stream": "", "scored": ScoredStep(samples=(), rewards=(1.0,)), "train": stats, "tokens": [2], "staleness": 0}
    log = StepLog(tmp_path / "job")
    log.write(t=1.0, step=1, step_s=1.0, **step)
    log.close()
    with open(tmp_path / "job" / "metrics.jsonl", "a") as f:
        f.write('{"step": 2, "reward_me')  # the disk filled mid-line
    log.write(t=2.0, step=3, step_s=1.0, **step)
    assert [line["step"] for line in read_lines(tmp_path / "job" / "metrics.jsonl")] == [1, 3]
    shutil.rmtree(tmp_path / "job")  # removed while the job runs: later lines go to the folder made again
    log.write(t=3.0, step=4, step_s=1.0, **step)
    log.close()
    assert [line["step"] for line in read_lines(tmp_path / "job" / "metrics.jsonl")] == [4] and log.problem == ""


def test_metrics_jsonl_and_tensorboard(tmp_path):
    from rlix.exec.data.recipe import EvalScore, ScoredStep
    from rlix.exec.data.rewards import FunctionScores
    from rlix.exec.job.steplog import StepLog
    from rlix.exec.train.grpo import TrainStats
    from rlix.metrics import Activity

    log = StepLog(tmp_path / "job")
    log.observe(0.0, (0, 1), Activity.HELD)
    log.observe(2.0, (1,), Activity.FREE)
    f = FunctionScores(name="my/rew.py:exact", weight=1.0, values=(1.0, None, 0.0))
    scored = ScoredStep(
        samples=(), rewards=(1.0, 0.0, 0.0), functions=(f,), eval=EvalScore(prompts=4, mean_reward=0.25, functions=(f,))
    )
    stats = TrainStats(loss=0.5, kl=0.01, clip_fraction=0.0, tokens=9, seconds=1.0)
    log.write(stream="", t=3.0, step=0, scored=scored, train=stats, tokens=[2, 4, 6], step_s=3.0, staleness=0)
    log.close()
    line = json.loads((tmp_path / "job" / "metrics.jsonl").read_text().splitlines()[0])
    assert line["gpu_s_held"] == pytest.approx(2 * 2.0 + 1 * 1.0)
    assert line["reward/rew.exact/mean"] == 0.5 and line["reward/rew.exact/none"] == 1
    assert (line["loss"], line["kl"], line["response_len_mean"], line["response_len_max"], line["eval/reward_mean"]) == (
        0.5,
        0.01,
        4.0,
        6,
        0.25,
    )
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(tmp_path / "job"))
    acc.Reload()
    assert acc.Scalars("reward_mean")[0].value == pytest.approx(1 / 3)


def test_full_finetune_checkpoint_round_trip(tmp_path, model_dir):
    import torch

    from rlix.exec.train import checkpoint
    from rlix.exec.train.grpo import GrpoConfig, GrpoLearner, Sample

    learner = GrpoLearner(str(model_dir), "cpu", GrpoConfig(lr=1e-2))
    samples = [Sample(prompt_ids=(1, 4, 5), completion_ids=(6, 2), advantage=a, old_logprobs=(-1.0, -1.0)) for a in (1.0, -1.0)]
    for _ in range(3):
        learner.train(samples)
        checkpoint.save(learner, tmp_path / "ck", model_dir)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step_000002", "step_000003"]  # the newest two
    assert (tmp_path / "ck" / "step_000003" / "tokenizer.json").is_file()
    fresh = GrpoLearner(str(model_dir), "cpu", GrpoConfig(lr=1e-2))
    assert checkpoint.restore(fresh, tmp_path / "ck") == 3
    for (k, a), b in zip(learner.model.state_dict().items(), fresh.model.state_dict().values()):
        assert torch.equal(a, b), k
    learner.train(samples)
    fresh.train(samples)  # same optimizer state and step: the same next update
    for a, b in zip(learner.model.parameters(), fresh.model.parameters()):
        assert torch.allclose(a, b)


def test_a_checkpoint_of_another_model_size_is_refused_before_any_actor(tmp_path, model_dir):
    """Before: the trainer's load failed after Ray and the actors had started, on one line reading only
    "CheckpointException: CheckpointException ranks:dict_keys([0])", exit 1."""
    import subprocess
    import sys

    import yaml

    from rlix.exec.data.model import ModelSize, build_model
    from rlix.exec.train import checkpoint
    from rlix.exec.train.grpo import GrpoConfig, GrpoLearner, Sample

    learner = GrpoLearner(str(model_dir), "cpu", GrpoConfig())  # hidden_size 32
    learner.train([Sample(prompt_ids=(1, 4, 5), completion_ids=(6, 2), advantage=1.0, old_logprobs=(-1.0, -1.0))])
    checkpoint.save(learner, tmp_path / "ck", model_dir)
    size = {"arch": "qwen2", "hidden_size": 64, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}
    raw = {
        "cluster": {"nodes": 1, "gpus_per_node": 1},
        "output": {"dir": str(tmp_path / "out")},
        "jobs": [
            {
                "name": "grown",
                "model": {"size": size},
                "checkpoint_dir": str(tmp_path / "ck"),
                "task": {"name": "copy"},
                "steps": 2,
                "roles": {"actor_train": {"gpus": [0]}, "actor_infer": {"gpus": [0]}},
            }
        ],
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(raw))
    cmd = [sys.executable, "-m", "rlix.exec.front.cli", str(tmp_path / "c.yaml"), "--no-console"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    (line,) = [x for x in proc.stderr.strip().splitlines() if "resumes from its checkpoint" not in x]
    assert line == (
        f"rlix-run: config error: jobs[0].checkpoint_dir: job 'grown': its checkpoint {tmp_path / 'ck' / 'step_000001'} "
        "holds another model than jobs[0].model (lm_head.weight is [100, 32] there, [100, 64] in the model); "
        "give a new "
        "checkpoint_dir, or the model it was trained from"
    )
    # and a trainer that loads it all the same says what the load raised
    grown = GrpoLearner(str(build_model(ModelSize(**size), tmp_path / "grown")), "cpu", GrpoConfig())
    with pytest.raises(RuntimeError) as raised:
        checkpoint.restore(grown, tmp_path / "ck")
    assert str(raised.value) == (
        f"checkpoint {tmp_path / 'ck' / 'step_000001'}: rank 0 could not load it: ValueError: Size mismatch between "
        "saved torch.Size([100, 32]) and current: torch.Size([100, 64]) for model.model.embed_tokens.weight"
    )
    # a layer more or fewer: every shared weight has its shape, and the names differ
    deeper = build_model(ModelSize(**{**size, "hidden_size": 32, "num_layers": 2}), tmp_path / "deeper")
    found = checkpoint.latest(tmp_path / "ck")
    assert (
        checkpoint.shape_clash(found, deeper) == "model.layers.1.input_layernorm.weight is in the model, not there, nor 11 more"
    )
    assert checkpoint.shape_clash(found, model_dir) == ""  # the model it was trained from
    (found / "dcp" / ".metadata").write_bytes(b"not a pickle")  # unreadable: the trainer's load will say why
    assert checkpoint.shape_clash(found, deeper) == ""


def test_cli_refuses_a_job_whose_prompts_are_all_too_long(tmp_path):
    import subprocess
    import sys

    import yaml

    (tmp_path / "long.jsonl").write_text(json.dumps({"q": "1" * 400 + "="}) + "\n")
    raw = {
        "cluster": {"nodes": 1, "gpus_per_node": 1},
        "output": {"dir": str(tmp_path / "out")},
        "jobs": [
            {
                "name": "long",
                "model": {"size": {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}},
                "data": {"path": str(tmp_path / "long.jsonl"), "prompt_field": "q"},
                "rewards": [{"function": f"{ROOT}/tests/data/trl_rewards.py:reward_len"}],
                "roles": {"actor_train": {"gpus": [0]}, "actor_infer": {"gpus": [0]}},
            }
        ],
    }
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    proc = subprocess.run(
        [sys.executable, "-m", "rlix.exec.front.cli", str(cfg), "--no-console"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlix-run: config error: jobs[0].data.path: job 'long': "), proc.stderr
    assert "longer than the model's limit of 256 tokens" in lines[0]
    assert not (tmp_path / "out").exists()  # refused before any actor started or any output was written


def test_a_checkpoint_that_names_no_pad_token_trains_padding_with_its_end_of_sequence_id(tmp_path, model_dir):
    """Before: a checkpoint whose config.json has no pad_token_id (Llama 3, Qwen2.5) failed its first
    training step with "int() argument must be ... not 'NoneType'"."""
    from rlix.exec.train.grpo import GrpoConfig, GrpoLearner, Sample

    nopad = Path(shutil.copytree(model_dir, tmp_path / "nopad"))
    config = json.loads((nopad / "config.json").read_text())
    del config["pad_token_id"]
    eos = config["eos_token_id"]
    (nopad / "config.json").write_text(json.dumps(config))
    learner = GrpoLearner(str(nopad), "cpu", GrpoConfig(lr=1e-2))
    assert learner.model.config.pad_token_id is None and learner.pad_id == eos
    samples = [Sample(prompt_ids=(1, 4), completion_ids=(6, 2, 7), advantage=1.0, old_logprobs=(-1.0,) * 3)]
    samples.append(Sample(prompt_ids=(1, 4, 5), completion_ids=(6,), advantage=-1.0, old_logprobs=(-1.0,)))
    learner.train(samples)  # ragged: the batch pads
