"""The executor's rollout order on a data job: predicted-longest first against the order as drawn.

Not a test: figures. A tiny Qwen2 first learns the copy task (supervised, about a minute on two
cores), so that its answers stop where the prompt's digits end: lengths differ from prompt to
prompt (1-24 tokens, long-tailed) and repeat across epochs, as a real dataset's do. One data job
of those prompts then runs twice with ``rlix-run``, once per ``dispatch``, all else equal: the
prompts, the seed, the pacing (a decode step takes ``decode_step_s`` on each logical GPU).

Per run, over the steps after the predictor is trusted (:data:`rlix.lengths.MIN_PAIRS` evidence
pairs, with one step's margin; the same steps in both runs):

- the rollout span of each step: its first worker starting to its last trajectory ending
  (``timeline.json``);
- its packing bound: the longest trajectory, or all trajectories' seconds over the job's slots,
  whichever is larger (``trace.json``);
- the tail: the span less the bound, the time the step waited on trajectories that started late;
- the predictor's rank correlation (``metrics.jsonl``).

Then whether both runs learnt the same, reward for reward, step for step: the order moves
trajectories in time, never what they sample.

    python benchmarks/exec_order.py [--steps 32] [--seeds 0,1] [--slots 4] [--out runs/exec_order]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's rlix, whatever is installed

from rlix.exec.data.model import ModelSize, build_model, load_model, load_tokenizer
from rlix.exec.data.tasks import make_task
from rlix.exec.front import api
from rlix.exec.job.steplog import read_lines
from rlix.exec.records import JobStatus
from rlix.lengths import MIN_PAIRS
from rlix.sim.sweep import SweepError, parse_seeds

MAX_LEN = 24  # the longest answer (digits); the task draws them long-tailed
PROMPTS, PER_STEP, GROUP = 32, 8, 8  # the dataset's rows, prompts a step, samples a prompt
WORKERS = 4  # logical GPUs the rollout may use
SFT = {"steps": 1500, "batch": 64, "lr": 3e-3, "seed": 0}


def copy_model(directory: Path) -> Path:
    """A Qwen2 of hidden size 64 taught to copy a digit string and stop (built once per directory)."""
    marker = directory / "sft.json"
    wanted = json.dumps({**SFT, "max_len": MAX_LEN}, sort_keys=True)
    if marker.is_file() and marker.read_text() == wanted:
        return directory
    import torch

    build_model(ModelSize(arch="qwen2", hidden_size=64, num_layers=2, num_heads=4, intermediate_size=128), directory)
    tok, model = load_tokenizer(directory), load_model(directory)
    task, rng = make_task("copy", min_len=1, max_len=MAX_LEN), random.Random(SFT["seed"])
    torch.manual_seed(SFT["seed"])
    opt = torch.optim.AdamW(model.parameters(), lr=SFT["lr"])
    t0 = time.perf_counter()
    for i in range(SFT["steps"]):
        ids, mask = _batch(tok, task.sample(rng, 0, SFT["batch"]))
        logits = model(ids).logits[:, :-1]
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        loss = (nll * mask[:, 1:]).sum() / mask[:, 1:].sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i % 250 == 0 or i == SFT["steps"] - 1:
            print(f"  copy model: step {i:>4} loss {loss.item():.3f} ({time.perf_counter() - t0:.0f} s)", flush=True)
    model.save_pretrained(str(directory))
    marker.write_text(wanted)
    return directory


def _batch(tok, prompts):
    """Token ids (BOS, the prompt, its answer, EOS; padded) and a mask of the answer and EOS: the loss's tokens."""
    import torch

    seqs, masks = [], []
    for p in prompts:
        prompt = [tok.bos_token_id, *tok.encode(p.text, add_special_tokens=False)]
        answer = [*tok.encode(p.answer, add_special_tokens=False), tok.eos_token_id]
        seqs.append(prompt + answer)
        masks.append([0] * len(prompt) + [1] * len(answer))
    width = max(map(len, seqs))
    ids = torch.tensor([s + [tok.pad_token_id] * (width - len(s)) for s in seqs])
    mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.float)
    return ids, mask


def write_run(directory: Path, model: Path, *, seed: int, dispatch: str, steps: int, slots: int) -> Path:
    """The dataset (its rows drawn by ``seed``) and one job's config, ordered by ``dispatch``."""
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / "copy.jsonl"
    rows = make_task("copy", min_len=1, max_len=MAX_LEN).sample(random.Random(seed), 0, PROMPTS)
    data.write_text("".join(json.dumps({"prompt": p.text, "answer": p.answer}) + "\n" for p in rows))
    config = {
        "cluster": {"nodes": 1, "gpus_per_node": WORKERS},
        "scheduler": {"min_residency_s": 5.0, "report_ttl_s": 10.0, "plan_interval_s": 0.5},
        "emulation": {"decode_step_s": 0.05, "train_token_s": 0.0002},
        "output": {"dir": str(directory / "out"), "console": False},
        "jobs": [
            {
                "name": "copy",
                "model": {"path": str(model)},
                "data": {"path": str(data)},
                "rewards": [{"function": "rlix.exec.data.tasks:digit_match"}],
                "steps": steps,
                "prompts_per_step": PER_STEP,
                "group_size": GROUP,
                "max_new_tokens": MAX_LEN + 4,
                "slots_per_worker": slots,
                "algo": {"lr": 1.0e-4},
                "roles": {"actor_train": {"gpus": [0]}, "actor_infer": {"gpus": f"0-{WORKERS - 1}"}},
                "dispatch": dispatch,
                "seed": seed,
            }
        ],
    }
    path = directory / "run.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@dataclass(frozen=True)
class Step:
    span_s: float  # first worker starting to the last trajectory ending
    bound_s: float  # the longest trajectory, or the trajectories' seconds over the slots
    rank: float | None  # the predictor's rank correlation, as metrics.jsonl reports it
    reward: float


def read_steps(out: Path, slots: int) -> list[Step]:
    """Each step of a finished run (``slots`` trajectories at once on each worker), from its timeline, trace and metrics."""
    events = json.loads((out / "timeline.json").read_text())["traceEvents"]
    rollouts = [e for e in events if e["name"] == "copy:rollout"]
    trace = json.loads((out / "trace.json").read_text())["pipelines"][0]["steps"]
    lines = read_lines(out / "copy" / "metrics.jsonl")
    steps = []
    marks = sorted((e for e in events if e["name"].startswith("step ")), key=lambda e: e["ts"])
    for e, traj, line in zip(marks, trace, lines, strict=True):
        inside = [r for r in rollouts if e["ts"] <= r["ts"] < e["ts"] + e["dur"]]
        span = (max(r["ts"] + r["dur"] for r in inside) - min(r["ts"] for r in inside)) / 1e6
        gen = traj["trajectories"]
        bound = max(max(gen), sum(gen) / (WORKERS * slots))
        steps.append(Step(span, bound, line["length_rank_correlation"], line["reward_mean"]))
    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=32, help="steps a run (default 32: 8 epochs of the dataset)")
    parser.add_argument("--seeds", default="0", help="dataset and job seeds, e.g. 0,1,2 (default 0)")
    parser.add_argument(
        "--slots",
        type=int,
        default=4,
        help=f"trajectories a worker decodes at once (default 4: {WORKERS * 4} slots, {PER_STEP * GROUP} trajectories a step)",
    )
    parser.add_argument("--out", default=str(ROOT / "runs" / "exec_order"), help="the model, the runs' configs and outputs")
    args = parser.parse_args()
    out = Path(args.out)
    try:
        seeds = parse_seeds(args.seeds)
    except SweepError as exc:
        _fail(str(exc))
    trusted = math.ceil(MIN_PAIRS / (PER_STEP * GROUP))  # the step within which the predictor has its pairs
    if args.steps <= trusted + 1:
        _fail(f"--steps {args.steps}: give more than {trusted + 1}; the predictor is trusted within step {trusted}")
    model = copy_model(out / "model")
    print(f"steps {trusted + 2}-{args.steps} measured: the predictor is trusted within step {trusted} ({MIN_PAIRS} pairs)")
    print(f"{'seed':>4} {'dispatch':>9} {'span s':>7} {'bound s':>7} {'tail s':>6} {'span/bound':>10} {'rank r':>6}")
    tails: dict[str, list[float]] = {"drawn": [], "predicted": []}
    for seed in seeds:
        rewards = {}
        for dispatch in ("drawn", "predicted"):
            run_dir = out / f"seed{seed}-{dispatch}"
            res = api.run(write_run(run_dir, model, seed=seed, dispatch=dispatch, steps=args.steps, slots=args.slots))
            job = res.results["copy"]
            if job.status is not JobStatus.FINISHED or len(job.steps) != args.steps:
                why = job.error or "no error"
                _fail(f"seed {seed}, {dispatch}: the job ended {job.status.value} after {len(job.steps)} steps ({why})")
            steps = read_steps(run_dir / "out", args.slots)
            rewards[dispatch] = [s.reward for s in steps]
            late = steps[trusted + 1 :]
            span, bound = statistics.fmean(s.span_s for s in late), statistics.fmean(s.bound_s for s in late)
            ranks = [s.rank for s in late if s.rank is not None]
            tails[dispatch].append(span - bound)
            print(
                f"{seed:>4} {dispatch:>9} {span:>7.2f} {bound:>7.2f} {span - bound:>6.2f} {span / bound:>10.3f} "
                f"{statistics.fmean(ranks) if ranks else float('nan'):>6.2f}",
                flush=True,
            )
        if not ranks or statistics.fmean(ranks) < 0.5:  # the predicted run's (the last one)
            print(f"{seed:>4} warning: rank correlation under 0.5; the copy model may not have learnt to stop")
        same = rewards["drawn"] == rewards["predicted"]
        print(f"{seed:>4} same rewards step for step: {'yes' if same else 'NO'}")
    drawn, predicted = statistics.fmean(tails["drawn"]), statistics.fmean(tails["predicted"])
    print(f"mean tail a step: drawn {drawn:.2f} s, predicted {predicted:.2f} s ({predicted / drawn:.2f}x)")


def _fail(message: str) -> None:
    print(f"exec_order: {message}", file=sys.stderr)
    raise SystemExit(2)


if __name__ == "__main__":
    main()
