"""A Ray cluster of 4 logical GPUs with the rlix scheduler service, for the service's tests and benchmark.

The cluster has a token of its own (nothing is read from ``~/.ray``); submitters
are ``rlix-run --address`` processes, and the tools are ``rlix ... --address``.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from rlix.transport import ray_address_file

ROOT = Path(__file__).resolve().parent.parent
# The environment variable that marks a ServiceCluster's processes.
MARKER = "RLIX_TEST_CLUSTER"
MODEL = {"size": {"arch": "qwen2", "hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def job(name: str, home: str, steps: int, *, ranks: int = 1, arrival_s: float = 0.0, priority: int = 0) -> dict:
    """A tiny copy-task job: trains on the first ``ranks`` GPUs of its 2-GPU home, may roll out on all 4
    GPUs. One rank by default: each is a process, seconds of imports on a CPU host, and two ranks on gloo
    make each step several times longer."""
    first = int(home.split("-")[0])
    return {
        "name": name,
        "model": MODEL,
        "task": {"name": "copy", "min_len": 1, "max_len": 6},
        "steps": steps,
        "prompts_per_step": 8,
        "group_size": 4,
        "max_new_tokens": 8,
        "slots_per_worker": 4,
        "arrival_s": arrival_s,
        "priority": priority,
        "home": home,
        "roles": {"actor_train": {"gpus": list(range(first, first + ranks))}, "actor_infer": {"gpus": "0-3"}},
    }


def write_config(path: Path, jobs: list[dict], *, cluster: dict | None = None, out: Path | None = None) -> Path:
    """``out``: the output directory (``out_<stem>`` beside the config by default)."""
    cfg = {
        "scheduler": {"min_residency_s": 2.0, "report_ttl_s": 10.0},
        "output": {"dir": str(out or path.parent / f"out_{path.stem}"), "console": False},
        "jobs": jobs,
    }
    if cluster is not None:
        cfg["cluster"] = cluster
    path.write_text(yaml.safe_dump(cfg))
    return path


class ServiceCluster:
    """``ray start --head`` with 4 GPUs and a token of its own; commands run against it.

    The cluster's head processes (and every command run against it) carry a marker in their
    environment, and :meth:`stop` kills those and their children alone: ``ray stop`` would stop every Ray cluster
    on the machine, those of tests running beside this one too.
    """

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        token = tmp / "ray_auth_token"
        token.write_text(secrets.token_hex(32))
        self.marker = secrets.token_hex(8)
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token), MARKER: self.marker}
        self.env.pop("RAY_AUTH_TOKEN", None)
        self.env.pop("RAY_ADDRESS", None)
        self.ray = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")

    def start(self) -> None:
        cmd = [self.ray, "start", "--head", f"--port={self.port}", "--num-gpus=4", "--num-cpus=2"]
        cmd += ["--include-dashboard=false", "--disable-usage-stats"]
        subprocess.run(cmd, check=True, capture_output=True, env=self.env, timeout=120, cwd=ROOT)

    def stop(self) -> None:
        """Kill the cluster's processes: those that carry its marker (its head, raylet and the commands
        run against it) and their children (Ray's workers and agents, which the raylet starts with
        an environment of their own)."""
        import psutil

        mine: dict[int, psutil.Process] = {}
        for proc in psutil.process_iter():
            try:
                if proc.environ().get(MARKER) == self.marker:
                    mine.update({p.pid: p for p in (proc, *proc.children(recursive=True))})
            except psutil.Error:  # gone, or not ours to read
                continue
        for proc in mine.values():
            with contextlib.suppress(psutil.Error):
                proc.kill()
        psutil.wait_procs(list(mine.values()), timeout=30)
        # as `ray stop` does: 'auto' no longer means the cluster just stopped
        with contextlib.suppress(OSError):
            if ray_address_file().read_text().strip().endswith(f":{self.port}"):
                ray_address_file().unlink()

    def rlix(self, *args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "rlix.exec.service.cli", *args, "--address", self.address]
        env = {**self.env, **(env or {})}
        return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT)

    def submit(self, config: Path, *extra: str, via_env: bool = False) -> subprocess.Popen:
        """``rlix-run CONFIG --address A`` in the background (its output in CONFIG.out / .err).

        ``via_env``: the address in ``RAY_ADDRESS`` instead, as Ray gives a job's entrypoint.
        """
        where = [] if via_env else ["--address", self.address]
        env = {**self.env, "RAY_ADDRESS": self.address} if via_env else self.env
        cmd = [sys.executable, "-m", "rlix.exec.front.cli", str(config), *where, "--no-console", *extra]
        out, err = open(config.with_suffix(".out"), "w"), open(config.with_suffix(".err"), "w")
        return subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env, cwd=config.parent)

    def status(self) -> tuple[dict, float]:
        """``rlix status --json`` and the seconds it took (the whole command, Ray connection included)."""
        t = time.perf_counter()
        res = self.rlix("status", "--json")
        assert res.returncode == 0, res.stderr[-2000:]
        return json.loads(res.stdout), time.perf_counter() - t

    def python(self, code: str) -> subprocess.CompletedProcess:
        """Run ``code`` in a driver joined to the cluster (``ray`` imported, joined)."""
        prelude = f"import ray\nray.init(address='{self.address}', log_to_driver=False)\n"
        return subprocess.run(
            [sys.executable, "-c", prelude + code], capture_output=True, text=True, env=self.env, timeout=120, cwd=ROOT
        )


@contextmanager
def scheduler_running(tmp: Path) -> Iterator[tuple[ServiceCluster, list[subprocess.Popen]]]:
    """A :class:`ServiceCluster` with the rlix scheduler started on it, and a list for the processes the test
    starts: at the end, those still running are killed and the cluster is stopped."""
    cluster = ServiceCluster(tmp)
    cluster.start()
    procs: list[subprocess.Popen] = []
    try:
        res = cluster.rlix("scheduler", "start")
        assert res.returncode == 0, res.stderr[-2000:]
        yield cluster, procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        cluster.stop()


def jobs_by_name(status: dict) -> dict[str, dict]:
    return {j["name"]: j for j in status["jobs"]}


def gpus_held(status: dict) -> int:
    return sum(len(j["gpus"]) for j in status["jobs"])


def wait_for(predicate, cluster: ServiceCluster, timeout_s: float, every_s: float = 1.0) -> dict:
    """Poll ``rlix status`` until ``predicate(status)``; returns that status (AssertionError on timeout)."""
    deadline = time.time() + timeout_s
    while True:
        status, _ = cluster.status()
        if predicate(status):
            return status
        assert time.time() < deadline, f"not reached within {timeout_s} s: {json.dumps(status)[:2000]}"
        time.sleep(every_s)


def run_dir(config: Path) -> Path:
    """The one run of ``config`` through the scheduler: its directory, named by its first job's id."""
    [run] = (config.parent / f"out_{config.stem}").glob("*#*")
    return run


def gpu_intervals(*configs: Path) -> dict[int, list[tuple[float, float, str]]]:
    """What the submitters' own processes did on each GPU, on one clock: from each run's
    timeline.json (times from its start) and metrics.json (its start, Unix seconds)."""
    out: dict[int, list[tuple[float, float, str]]] = {}
    for config in configs:
        run = run_dir(config)
        start = json.loads((run / "metrics.json").read_text())["executor"]["started_at_unix_s"]
        for e in json.loads((run / "timeline.json").read_text())["traceEvents"]:
            if e.get("ph") == "X" and e.get("pid") == 0:
                t = start + e["ts"] / 1e6
                out.setdefault(e["tid"], []).append((t, t + e["dur"] / 1e6, e["name"].split(":")[0]))
    return out


def overlaps(intervals: dict[int, list[tuple[float, float, str]]], slack_s: float = 0.05) -> list[tuple]:
    """(gpu, a, b) where two jobs worked on one GPU at once (beyond ``slack_s`` of clock jitter)."""
    found = []
    for gpu, spans in sorted(intervals.items()):
        spans = sorted(spans)
        for i, (s1, e1, j1) in enumerate(spans):
            for s2, e2, j2 in spans[i + 1 :]:
                if s2 >= e1 - slack_s:
                    break
                if j1 != j2 and min(e1, e2) - s2 > slack_s:
                    found.append((gpu, (j1, s1, e1), (j2, s2, e2)))
    return found


class Prometheus:
    """A real Prometheus server (Debian's ``prometheus``) scraping the rlix scheduler's ``/metrics`` every second."""

    def __init__(self, tmp: Path, target_port: int) -> None:
        self.binary = shutil.which("prometheus")
        self.port = free_port()
        self.tmp = tmp
        config = tmp / "prometheus.yml"
        target = {"targets": [f"127.0.0.1:{target_port}"]}
        # honor_labels: the series' own job label (a job id) is kept, not renamed beside the scrape job's
        scrape = {"job_name": "rlix", "scrape_interval": "1s", "honor_labels": True, "static_configs": [target]}
        config.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": [scrape]}))
        self.config = config
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = [self.binary, f"--config.file={self.config}", f"--storage.tsdb.path={self.tmp / 'tsdb'}"]
        cmd += [f"--web.listen-address=127.0.0.1:{self.port}"]
        self.log = open(self.tmp / "prometheus.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while time.time() < deadline:  # ready once it answers queries and has scraped its target once
            try:
                if self.query("up") and self.query("up")[0]["value"][1] == "1":
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"prometheus did not scrape rlix within 60 s: {(self.tmp / 'prometheus.log').read_text()[-2000:]}")

    def query(self, expr: str) -> list[dict]:
        """An instant PromQL query's result (the HTTP API's ``data.result``)."""
        import urllib.parse
        import urllib.request

        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as reply:
            return json.loads(reply.read())["data"]["result"]

    def by_job(self, expr: str) -> dict[str, float]:
        """An instant query's values by their job label (a job id)."""
        return {r["metric"]["job"]: float(r["value"][1]) for r in self.query(expr)}

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
