"""Executor layer: ``rlix-run CONFIG --address A --detach``, a run that outlives its terminal.

The run's driver is an ``rlix-run`` process on the Ray head node, started and
owned by a detached Ray actor of rlix's own (no Ray dashboard, no ``ray job
submit``). The submitting process sends it the config (its paths made
absolute first, so they must be readable on the head node), waits until the
scheduler has given the run's jobs their ids, prints them and where the
outputs go, and returns. The run goes on with the terminal closed; its
outputs and its log (``rlix-run.log``: ``rlix logs JOB``) are on the head
node, in the directory it prints (``<output.dir>/<id>``, named by its first
job's id), its config and console output beside it
(``<output.dir>/detached-<tag>.yaml`` and ``.out``, whose last line says how the run
ended: ``rlix-run: exited with status N``). The actor ends once its run has.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import yaml

from rlix.exec.config import RunConfig, absolute_paths
from rlix.exec.error_text import ending
from rlix.exec.front.submission import TAG_ENV
from rlix.exec.service.connect import HEAD_NODE
from rlix.transport import NAMESPACE

CLAIM_WAIT_S = 120.0  # how long the submitter waits for the detached run to claim its jobs (s)


class DetachedRun:
    """The actor owning a detached ``rlix-run`` process on the head node."""

    def __init__(self, out_dir: str, config_yaml: str, args: list[str], tag: str, cwd: str) -> None:
        """``cwd``: where the submitter ran (the run starts there if the head node has it: reward files given
        relative to it are found)."""
        import ray

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        config = out / f"detached-{tag}.yaml"
        config.write_text(config_yaml)
        self.console_path = config.with_suffix(".out")
        address = ray.get_runtime_context().gcs_address
        cmd = [sys.executable, "-m", "rlix.exec.front.cli", str(config), "--address", address, "--no-console", *args]
        self.console = open(self.console_path, "w")
        env = {**driver_env(os.environ), TAG_ENV: tag}
        here = cwd if Path(cwd).is_dir() else out
        self.proc = subprocess.Popen(cmd, stdout=self.console, stderr=subprocess.STDOUT, env=env, cwd=here)
        threading.Thread(target=self._end_with_run, daemon=True).start()

    def poll(self) -> int | None:
        """The run's exit status, or None while it runs."""
        return self.proc.poll()

    def tail(self, lines: int = 20) -> str:
        """The end of the run's console output."""
        return "\n".join(self.console_path.read_text(errors="replace").splitlines()[-lines:])

    def _end_with_run(self) -> None:
        code = self.proc.wait()
        with contextlib.suppress(OSError), open(self.console_path, "a") as f:  # its last line: how it ended
            f.write(f"rlix-run: {ending(code)}\n")
        time.sleep(30)  # its submitter may still ask how it ended
        os._exit(0)


def driver_env(worker: dict[str, str]) -> dict[str, str]:
    """A Ray worker's environment made a driver's: without what Ray sets for its worker processes (a driver's
    GPUs hidden, its job and raylet), keeping how to reach the cluster (its token)."""
    return {
        k: v for k, v in worker.items() if k != "CUDA_VISIBLE_DEVICES" and (not k.startswith("RAY_") or k.startswith("RAY_AUTH"))
    }


def submit(config: RunConfig, *, address: str, out: str | None, source: str, extra: list[str]) -> int:
    """Start the run detached on the head node; prints its job ids and where its outputs are, once claimed.
    Returns the exit status: 0 once the jobs are submitted, else the run's own (it ended first)."""
    import ray

    from rlix import protocol, transport

    cwd = Path.cwd()
    config = absolute_paths(config, cwd)
    out_dir = Path(out).resolve() if out else Path(config.output.dir)  # absolute already
    tag = uuid.uuid4().hex[:8]
    body = yaml.safe_dump(config.model_dump(mode="json", exclude_unset=True), sort_keys=False)
    transport.join(address, 0, "--address", quiet=True)
    actor = (
        ray.remote(num_cpus=0)(DetachedRun)
        .options(name=f"rlix-run-{tag}", namespace=NAMESPACE, lifetime="detached", resources={HEAD_NODE: 0.001})
        .remote(str(out_dir), body, [*extra, "--out", str(out_dir), "--source", source], tag, str(cwd))
    )
    deadline = time.time() + CLAIM_WAIT_S
    while time.time() < deadline:
        code = ray.get(actor.poll.remote(), timeout=60)
        if code is not None:  # it ended before its jobs were submitted: say what it said
            print(ray.get(actor.tail.remote()), file=sys.stderr)
            return code
        service = transport.find()
        jobs = [] if service is None else [r for r in service.call_sync(protocol.Status()).jobs if r.submitter.endswith(tag)]
        if len(jobs) == len(config.jobs) and all(j.log for j in jobs):  # claimed, and its directory named
            print(f"rlix-run: detached on the head node; jobs {', '.join(f'{j.name} as {j.id}' for j in jobs)}")
            run_dir = Path(jobs[0].log.partition(":")[2]).parent
            print(f"rlix-run: outputs in {run_dir} there; follow a job with: rlix logs JOB --follow")
            return 0
        time.sleep(0.5)
    print(
        f"rlix-run: the detached run did not submit its jobs within {CLAIM_WAIT_S:g} s; see {out_dir}/detached-{tag}.out",
        file=sys.stderr,
    )
    return 1
