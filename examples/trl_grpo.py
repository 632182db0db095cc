"""TRL's GRPO quickstart on a tiny local model, as a job of the cluster's shared rlix scheduler.

The script is TRL's own: a dataset, a reward function, ``GRPOConfig`` and
``GRPOTrainer``. The lines that make it an rlix job end in ``# rlix``; without
them it is the plain TRL script. Its rollouts run on rlix's elastic rollout
workers, its training is a gang stage on its home GPU, and ``rlix cancel``
stops it at a step's end with a checkpoint (exit code 3).

    python examples/trl_grpo.py                       # private: rlix starts a Ray cluster and a scheduler of its own
    python examples/trl_grpo.py --address auto        # a job of the scheduler that runs on this host's Ray cluster
"""

from __future__ import annotations

import argparse
import random

from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

from rlix.integrations.trl import rlix_grpo  # rlix


def tiny_model(out_dir: str) -> str:
    """A small random-weight model and a character tokenizer saved as a checkpoint (it stands in for a hub model)."""
    from rlix.exec.data.model import ModelSize, build_model

    return str(build_model(ModelSize(arch="qwen2", hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128), out_dir))


def reward_len(completions, **kwargs):
    """TRL's quickstart reward: completions close to 6 characters."""
    return [-abs(6 - len(completion)) / 6 for completion in completions]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--address", default=None, help="a Ray cluster running the rlix scheduler (default: a private one)")
    p.add_argument("--name", default="trl-grpo", help="the job's name on the cluster")
    p.add_argument("--gpu", type=int, default=0, help="its home GPU, where it trains")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", default="runs/trl_grpo")
    p.add_argument("--resume", action="store_true", help="go on from the last checkpoint in --output-dir")
    args = p.parse_args(argv)

    rng = random.Random(args.seed)
    words = ["".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 6))) for _ in range(64)]
    dataset = Dataset.from_dict({"prompt": [f"{w}=" for w in words]})
    training_args = GRPOConfig(
        output_dir=args.output_dir,
        max_steps=args.steps,
        per_device_train_batch_size=8,
        num_generations=4,
        max_completion_length=12,
        learning_rate=1e-3,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        bf16=False,  # the tiny model trains in float32, on a CPU too
        seed=args.seed,
    )
    trainer = GRPOTrainer(
        model=tiny_model(f"{args.output_dir}/model"),
        reward_funcs=reward_len,
        args=training_args,
        train_dataset=dataset,
        **rlix_grpo(args.name, address=args.address, train_gpus=[args.gpu], seed=args.seed),  # rlix
    )
    trainer.train(resume_from_checkpoint=args.resume or None)
    rewards = [round(row["reward"], 4) for row in trainer.state.log_history if "reward" in row]
    print(f"{args.name}: rewards {rewards}")


if __name__ == "__main__":
    main()
