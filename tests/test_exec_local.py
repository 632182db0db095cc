"""The GRPO recipe in-process (no Ray): reward rises on the code-generated task."""

from __future__ import annotations

import pytest

from rlix.exec.config import JobConfig
from rlix.exec.data.rewards import group_advantages

pytestmark = [pytest.mark.heavy, pytest.mark.in_process]


def test_group_advantages_are_relative_to_the_group():
    adv = group_advantages([1.0, 0.0, 0.5, 0.5], [0, 0, 1, 1])
    assert adv[0] > 0 > adv[1]
    assert adv[2] == adv[3] == 0.0


@pytest.mark.parametrize("seed", [0, 1])
def test_reward_rises_in_process(tmp_path, seed):
    from local_run import run_local

    job = JobConfig.model_validate(
        dict(
            name="a",
            model={"size": {"seed": seed}},
            task={"name": "copy"},
            steps=8,
            seed=seed,
            roles={"actor_train": {"gpus": [0]}, "actor_infer": {"gpus": [0]}},
        )
    )
    steps = run_local(job, tmp_path)
    first = sum(s.mean_reward for s in steps[:2]) / 2
    last = sum(s.mean_reward for s in steps[-2:]) / 2
    assert last > first + 0.05, [round(s.mean_reward, 3) for s in steps]
