"""Config of multi-LoRA jobs and of the vLLM rollout backend: one-line errors naming the field."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import assert_config_error_names

from rlix.exec.config import ConfigError, load_config, parse_config

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def _mixed() -> dict:
    return yaml.safe_load((EXAMPLES / "cpu_mixed.yaml").read_text())


def test_cpu_mixed_example_validates():
    cfg = load_config(EXAMPLES / "cpu_mixed.yaml")
    kinds = [j.kind for j in cfg.jobs]
    assert kinds == ["full_finetune", "multi_lora"]
    lora = cfg.jobs[1]
    assert len(lora.adapters) >= 2 and all(j.rollout_backend == "torch" for j in cfg.jobs)
    spec = lora.lora_spec()
    assert spec.names == tuple(a.name for a in lora.adapters)
    assert cfg.jobs[0].lora_spec() is None


@pytest.mark.parametrize(
    "edit, field",
    [
        (lambda c: c["jobs"][1].pop("adapters"), "jobs[1]"),
        (lambda c: c["jobs"][1]["adapters"][1].update(name="copy"), "jobs[1]"),
        (lambda c: c["jobs"][1]["adapters"][0].update(steps=0), "jobs[1].adapters[0].steps"),
        (lambda c: c["jobs"][1]["adapters"][0]["algo"].update(kl_coef=0.1), "jobs[1].adapters[0].algo"),
        (lambda c: c["jobs"][0].update(adapters=[{"name": "x"}]), "jobs[0]"),
        (lambda c: c["jobs"][1]["lora"].update(rank=0), "jobs[1].lora.rank"),
        (lambda c: c["jobs"][1].update(rollout_backend="tgi"), "jobs[1].rollout_backend"),
        (lambda c: c["jobs"][1].update(vllm={"sleep_level": 3}), "jobs[1].vllm.sleep_level"),
    ],
)
def test_bad_multi_lora_config_names_the_field(edit, field):
    raw = _mixed()
    edit(raw)
    assert_config_error_names(raw, field)


@pytest.mark.skipif(HAVE_VLLM, reason="vllm is installed here")
def test_vllm_backend_without_vllm_is_a_one_line_config_error():
    raw = _mixed()
    raw["jobs"][1]["rollout_backend"] = "vllm"
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    msg = str(info.value)
    assert msg.startswith("jobs[1].rollout_backend: vllm is not installed") and "\n" not in msg


@pytest.mark.skipif(HAVE_VLLM, reason="vllm is installed here")
def test_gpu_mixed_example_asks_for_vllm():
    with pytest.raises(ConfigError, match="rollout_backend: vllm is not installed"):
        load_config(EXAMPLES / "gpu_mixed.yaml")
    raw = yaml.safe_load((EXAMPLES / "gpu_mixed.yaml").read_text())
    for job in raw["jobs"]:
        job["rollout_backend"] = "torch"
    cfg = parse_config(raw)  # everything else about it is valid
    assert any(j.kind == "multi_lora" for j in cfg.jobs)


@pytest.mark.exec
def test_torch_path_never_imports_vllm():
    code = (
        "import sys, rlix, rlix.exec.config, rlix.exec.rollout.torch_backend, rlix.exec.train.lora, "
        "rlix.exec.job.coordinator, rlix.exec.rollout.actor, rlix.exec.train.actor;"
        "from rlix.exec.rollout.torch_backend import make_backend; make_backend('torch');"
        "print('vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_a_lora_workers_adapter_folder_left_by_a_killed_process_is_removed_by_the_next(tmp_path):
    """Before: a LoRA rollout worker ended with ray.kill never ran its close, and its folder of adapter
    versions stayed in /tmp for good. A worker holds a lock on its folder while its process lives; the
    next worker on the host removes the folders whose lock nobody holds, and leaves the others alone."""
    from rlix.exec.rollout.vllm_backend import ADAPTER_PREFIX, adapter_folder

    make = (
        "from pathlib import Path; from rlix.exec.rollout.vllm_backend import adapter_folder; "
        f"print(adapter_folder(Path('{tmp_path}'))[0])"
    )
    gone = Path(subprocess.run([sys.executable, "-c", make], capture_output=True, text=True, check=True).stdout.strip())
    (gone / "a-v3").mkdir()
    live, fd = adapter_folder(tmp_path)  # held by this process
    odd = [tmp_path / f"{ADAPTER_PREFIX}{name}" for name in ("99999999999999999999-x", "\u00b2-x", "no-lock")]
    for folder in odd:
        folder.mkdir()
    again = Path(subprocess.run([sys.executable, "-c", make], capture_output=True, text=True, check=True).stdout.strip())
    os.close(fd)
    assert not gone.exists() and live.is_dir() and all(f.is_dir() for f in odd)
    assert again.name.startswith(ADAPTER_PREFIX) and again != live


@pytest.mark.exec
def test_a_lora_target_no_module_has_is_refused_before_any_actor(tmp_path):
    """Before: a misspelled target module failed the job in its trainer after Ray started and the model
    loaded (peft's NoMatchingPeftModuleError), exit 1."""
    from rlix.exec.front.api import check_lora_targets

    raw = _mixed()
    lora = next(i for i, j in enumerate(raw["jobs"]) if j.get("kind") == "multi_lora")
    cfg = parse_config(raw)
    models = {j.name: str(j.model.directory(tmp_path)) for j in cfg.jobs}
    check_lora_targets(cfg, models)  # the example's own targets are there
    raw["jobs"][lora]["lora"] = {"target_modules": ["q_proj", "q_prj"]}
    check_lora_targets(parse_config(raw), models)  # as peft: one that matches is enough
    raw["jobs"][lora]["lora"] = {"target_modules": ["q_prj", "v_prj"]}
    with pytest.raises(ConfigError) as info:
        check_lora_targets(parse_config(raw), models)
    msg = str(info.value)
    name = raw["jobs"][lora]["name"]
    assert msg.startswith(f"jobs[{lora}].lora.target_modules: job '{name}': none of q_prj, v_prj names a module of its model")
    assert "e.g. down_proj, gate_proj, k_proj, o_proj, q_proj" in msg and "\n" not in msg


@pytest.mark.exec
def test_completions_longer_than_the_model_takes_are_refused_before_any_actor(tmp_path):
    """Before: a task job with max_new_tokens past its model's positions trained on, generating past them."""
    from rlix.exec.front.api import check_completion_room

    raw = _mixed()
    cfg = parse_config(raw)
    models = {j.name: str(j.model.directory(tmp_path)) for j in cfg.jobs}
    check_completion_room(cfg, models)
    raw["jobs"][0]["max_new_tokens"] = 400
    with pytest.raises(ConfigError, match=r"^jobs\[0\].max_new_tokens: job '\w+': 400 tokens leave no room .* 256 positions"):
        check_completion_room(parse_config(raw), models)
