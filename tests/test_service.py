"""The shared scheduler service: independent ``rlix-run --address`` submitters on one Ray cluster.

One Ray cluster (4 logical GPUs, a token of its own) and one service for the
module; each test submits jobs of its own names. ``rlix status --json`` is
polled while jobs run.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import warnings

import pytest
from service_cluster import (
    Prometheus,
    ServiceCluster,
    free_port,
    gpu_intervals,
    gpus_held,
    job,
    jobs_by_name,
    overlaps,
    run_dir,
    wait_for,
    write_config,
)

from rlix import protocol

pytest.importorskip("ray")
pytestmark = [pytest.mark.heavy, pytest.mark.exec]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = ServiceCluster(tmp_path_factory.mktemp("service"))
    c.start()
    c.metrics_port = free_port()
    try:
        c.history = c.tmp / "history.sqlite"
        knobs = ("--set", "min_residency_s=2", "--set", "report_ttl_s=10")
        res = c.rlix("scheduler", "start", *knobs, "--metrics-port", str(c.metrics_port), "--history", str(c.history))
        assert res.returncode == 0 and "rlix scheduler started: 1 x 4 GPUs, policy rlix" in res.stdout, res.stderr
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def prom(cluster, tmp_path_factory):
    """A real Prometheus server scraping the scheduler for the whole module (.ci/run installs Debian's package)."""
    server = Prometheus(tmp_path_factory.mktemp("prometheus"), cluster.metrics_port)
    if server.binary is None:  # the tests' other checks still run
        warnings.warn("no Prometheus server (apt-get install prometheus): the metrics are not scraped", stacklevel=1)
        yield None
        return
    server.start()
    yield server
    server.stop()


def finished(proc, timeout_s: float = 300) -> int:
    return proc.wait(timeout=timeout_s)


def metrics(config) -> dict:
    return json.loads((run_dir(config) / "metrics.json").read_text())


def wait_for_history(cluster, ids: set[str], timeout_s: float = 30) -> list[dict]:
    """``rlix history --json``'s rows of these jobs, once all are there (written once their GPUs are back)."""
    deadline = time.time() + timeout_s
    while True:
        res = cluster.rlix("history", "--json")
        assert res.returncode == 0, res.stderr[-2000:]
        rows = [r for r in json.loads(res.stdout) if r["id"] in ids]
        if len(rows) == len(ids):
            return rows
        assert time.time() < deadline, f"not in the history within {timeout_s} s: {ids - {r['id'] for r in rows}}"
        time.sleep(1)


def used_by_prometheus(prom, jobs: list[dict]) -> dict[str, float]:
    """The jobs' GPU-seconds as a PromQL query of the scheduler's metrics reads them (a scrape after they ended)."""
    time.sleep(2.5)  # a scrape after the status was read (every 1 s)
    ids = "|".join(j["id"] for j in jobs)
    return prom.by_job(f'sum by (job) (rlix_job_gpu_seconds{{kind="used",job=~"{ids}"}})')


def test_two_submitters_started_apart_share_the_gpus(cluster, prom, tmp_path):
    # alpha runs on while beta loads and runs (its processes outside its home started at the lowest
    # priority), then is cancelled: its steps are only there to outlast beta
    first = write_config(tmp_path / "first.yaml", [job("alpha", "0-1", steps=1000)])
    second = write_config(tmp_path / "second.yaml", [job("beta", "2-3", steps=4)])
    a = cluster.submit(first)
    # once alpha's rollout has spread over beta's home too (its processes there are up: no worker goes there before)
    wait_for(lambda s: any(g in (2, 3) for g, _ in jobs_by_name(s).get("alpha", {}).get("gpus", [])), cluster, 120)
    # while alpha runs; found through RAY_ADDRESS, as a Ray job's entrypoint is
    b = cluster.submit(second, via_env=True)
    both, seen, latencies = False, [], []
    while b.poll() is None:
        assert a.poll() is None, first.with_suffix(".err").read_text()[-2000:]
        status, took = cluster.status()
        latencies.append(took)
        seen.append(status)
        assert gpus_held(status) <= 4, status  # never more GPUs held than the cluster has
        held = {j["name"] for j in status["jobs"] if j["gpus"]}
        both |= {"alpha", "beta"} <= held
        time.sleep(0.5)
    assert b.returncode == 0, second.with_suffix(".err").read_text()[-2000:]
    assert both, "the two jobs never held GPUs at the same time"
    assert cluster.rlix("cancel", "alpha").returncode == 0
    assert finished(a) == 3, first.with_suffix(".err").read_text()[-2000:]
    final, _ = cluster.status()
    jobs = jobs_by_name(final)
    assert (jobs["alpha"]["state"], jobs["beta"]["state"]) == ("cancelled", "finished")
    assert jobs["alpha"]["steps_done"] >= 1 and jobs["beta"]["steps_done"] == 4
    # alpha's rollout used beta's home before beta came: borrowed by alpha is lent by beta
    assert jobs["alpha"]["borrowed_s"] > 0 and jobs["beta"]["lent_s"] > 0
    # every busy GPU-second is some job's
    assert sum(j["gpu_s"] for j in final["jobs"]) == pytest.approx(final["busy_gpu_s"], rel=1e-9)
    # and Prometheus, scraping the scheduler itself, reads what rlix status says
    ended = [jobs["alpha"], jobs["beta"]]
    if prom is not None:
        assert used_by_prometheus(prom, ended) == pytest.approx({j["id"]: j["gpu_s"] for j in ended}, rel=1e-6)
    assert 0 < final["utilization"] <= 1 and final["idle_fraction"] == pytest.approx(1 - final["utilization"])
    assert metrics(second)["trajectories_lost"] == 0
    assert metrics(first)["executor"]["shared"] and metrics(first)["policy"] == "rlix"
    # what the two submitters' processes really did: both on beta's home, never two jobs on one GPU at once
    spans = gpu_intervals(first, second)
    assert {j for g in (2, 3) for *_, j in spans.get(g, [])} == {"alpha", "beta"}, spans
    assert not overlaps(spans), overlaps(spans)[:3]
    median = sorted(latencies)[len(latencies) // 2]
    print(f"rlix status: {len(latencies)} answers, median {median:.2f} s, max {max(latencies):.2f} s")


def test_a_killed_submitter_loses_its_jobs_and_their_gpus_go_back(cluster, tmp_path):
    # gamma runs long enough for its processes outside its home to come up (no worker goes there before)
    keep = write_config(tmp_path / "keep.yaml", [job("gamma", "0-1", steps=200)])
    lose = write_config(tmp_path / "lose.yaml", [job("delta", "2-3", steps=30)])
    g, d = cluster.submit(keep), cluster.submit(lose)
    wait_for(lambda s: bool(jobs_by_name(s).get("delta", {}).get("gpus")) and "gamma" in jobs_by_name(s), cluster, 150)
    killed_at = time.time()
    d.send_signal(signal.SIGKILL)
    status = wait_for(lambda s: not jobs_by_name(s)["delta"]["gpus"], cluster, 60, every_s=0.5)
    back_s = time.time() - killed_at
    print(f"a SIGKILLed submitter's GPUs were back after {back_s:.1f} s")
    assert back_s <= 30
    assert jobs_by_name(status)["gamma"]["state"] not in ("finished", "failed", "cancelled"), status  # on at the kill
    assert finished(g, 600) == 0, keep.with_suffix(".err").read_text()[-2000:]
    assert metrics(keep)["trajectories_lost"] == 0  # shrunk and expanded around delta, it lost nothing
    status, _ = cluster.status()
    assert jobs_by_name(status)["delta"]["state"] == "failed"
    # gamma's own processes then worked on delta's home
    late = [j for gpu in (2, 3) for s, _, j in gpu_intervals(keep).get(gpu, []) if s > killed_at]
    assert "gamma" in late


def test_jobs_carry_on_when_the_scheduler_actor_is_killed(cluster, prom, tmp_path):
    one = write_config(tmp_path / "one.yaml", [job("epsilon", "0-1", steps=40)])
    two = write_config(tmp_path / "two.yaml", [job("zeta", "2-3", steps=40)])
    e, z = cluster.submit(one), cluster.submit(two)
    wait_for(lambda s: {jobs_by_name(s).get(n, {}).get("state") for n in ("epsilon", "zeta")} == {"running"}, cluster, 150)
    res = cluster.python("ray.kill(ray.get_actor('rlix-scheduler', namespace='rlix'), no_restart=False)\n")
    assert res.returncode == 0, res.stderr[-2000:]
    assert e.poll() is None and z.poll() is None, "a job ended before the scheduler was killed: nothing rejoined"
    assert finished(e) == 0, one.with_suffix(".err").read_text()[-2000:]
    assert finished(z) == 0, two.with_suffix(".err").read_text()[-2000:]
    assert metrics(one)["trajectories_lost"] == metrics(two)["trajectories_lost"] == 0
    status, _ = cluster.status()
    assert status["restarts"] == 1
    jobs = jobs_by_name(status)
    assert jobs["epsilon"]["state"] == jobs["zeta"]["state"] == "finished"  # they rejoined and ended under the new one
    # no GPU had both jobs' processes on it at once, across the restart too (a worker whose shrink was
    # under way when the scheduler died is reported by the rejoin until its GPUs are free)
    assert overlaps(gpu_intervals(one, two)) == []
    # the history holds both, as ended under the restarted scheduler, with the configs they came from
    ended = wait_for_history(cluster, {j["id"] for j in (jobs["epsilon"], jobs["zeta"])})
    assert {r["config"].split(":", 1)[1] for r in ended} == {str(one), str(two)}
    assert all(r["state"] == "finished" and r["phases"][0][0] == "submitted" for r in ended)
    # one series per job across the restart (the same job id), its GPU-seconds never falling back, and a sum by job
    # that counts each job once: what rlix status says
    both = [jobs["epsilon"], jobs["zeta"]]
    ids = "|".join(j["id"] for j in both)
    if prom is None:
        return
    assert used_by_prometheus(prom, both) == pytest.approx({j["id"]: j["gpu_s"] for j in both}, rel=1e-6)
    used = f'rlix_job_gpu_seconds{{kind="used",job=~"{ids}"}}'
    assert prom.by_job(f"count by (job) (last_over_time({used}[15m]))") == {j["id"]: 1.0 for j in both}
    assert prom.by_job(f"resets({used}[15m])") == {j["id"]: 0.0 for j in both}


def test_clashes_cancel_and_a_stop_refused_while_jobs_run(cluster, tmp_path):
    long = write_config(tmp_path / "long.yaml", [job("eta", "0-1", steps=1000)])
    p = cluster.submit(long)
    wait_for(lambda s: "eta" in jobs_by_name(s), cluster, 60)
    # a second job of the same name: one line, exit 2, nothing started
    clash = write_config(tmp_path / "clash.yaml", [job("eta", "2-3", steps=2)])
    res = cluster.submit(clash)
    assert res.wait(timeout=120) == 2
    err = clash.with_suffix(".err").read_text().strip().splitlines()
    assert err[-1].startswith("rlix-run: config error: jobs[0].name: job 'eta' is already on this cluster"), err[-1]
    assert "Traceback" not in "".join(err) and not (tmp_path / "out_clash").exists()
    # a cluster block the scheduler does not manage: one line, exit 2
    wrong = write_config(tmp_path / "wrong.yaml", [job("theta", "0-1", steps=2)], cluster={"nodes": 2, "gpus_per_node": 2})
    assert cluster.submit(wrong).wait(timeout=120) == 2
    last = wrong.with_suffix(".err").read_text().strip().splitlines()[-1]
    assert "cluster: the config says 2 nodes x 2 GPUs, but the rlix scheduler on this Ray cluster manages 1 x 4" in last
    # a policy other than the scheduler's: one line, exit 2
    other = write_config(tmp_path / "other.yaml", [job("iota", "0-1", steps=2)])
    assert cluster.submit(other, "--policy", "static").wait(timeout=120) == 2
    last = other.with_suffix(".err").read_text().strip().splitlines()[-1]
    assert "policy: the config asks for 'static', but the rlix scheduler on this Ray cluster runs 'rlix'" in last, last
    # a stop while a job runs is refused
    res = cluster.rlix("scheduler", "stop")
    assert res.returncode == 1 and "1 job not done (eta)" in res.stderr
    # cancel: the job ends cancelled, its submitter exits 3 with its outputs written and says who asked
    wait_for(lambda s: jobs_by_name(s)["eta"]["state"] in ("loading", "running"), cluster, 120)
    res = cluster.rlix("cancel", "eta")
    assert res.returncode == 0 and re.fullmatch(r"job eta#\d+ asked to stop\n", res.stdout), res.stdout
    assert p.wait(timeout=120) == 3
    assert "eta: cancelled" in long.with_suffix(".out").read_text()
    asker = protocol.asker()
    assert f"rlix-run: job eta: cancelled by {asker}" in long.with_suffix(".err").read_text()
    status = wait_for(lambda s: jobs_by_name(s)["eta"]["state"] == "cancelled", cluster, 30)
    first = jobs_by_name(status)["eta"]
    assert not first["gpus"] and first["error"] == f"cancelled by {asker}"
    went = [p for p, _ in first["phases"]]
    assert went[:3] == ["submitted", "queued", "loading"] and went[-1] == "cancelled", went
    res = cluster.rlix("cancel", "nobody")
    assert res.returncode == 2 and "no job 'nobody' on this cluster" in res.stderr
    # the name runs again: a job of its own, with its own id and GPU-seconds (nothing of the first carries over)
    again = write_config(tmp_path / "again.yaml", [job("eta", "2-3", steps=2)], out=tmp_path / "out_long")
    assert finished(cluster.submit(again)) == 0, again.with_suffix(".err").read_text()[-2000:]
    status, _ = cluster.status()
    runs = [j for j in status["jobs"] if j["name"] == "eta"]
    assert [j["state"] for j in runs] == ["cancelled", "finished"] and runs[0]["id"] != runs[1]["id"]
    assert f"eta as {runs[1]['id']}" in again.with_suffix(".err").read_text()
    assert runs[0]["gpu_s"] == pytest.approx(first["gpu_s"]) and 0 < runs[1]["gpu_s"]
    assert (runs[1]["steps_done"], runs[1]["steps_total"]) == (2, 2)
    # one output directory for both: each run writes under its job id, and neither's files overwrite the other's
    assert sorted(p.name for p in (tmp_path / "out_long").glob("eta#*")) == sorted(j["id"] for j in runs)
    partial = [json.loads((tmp_path / "out_long" / j["id"] / "metrics.json").read_text())["executor"]["partial"] for j in runs]
    assert partial == [True, False]
    res = cluster.rlix("cancel", runs[0]["id"])  # by id
    assert res.returncode == 0 and f"job {runs[0]['id']} already cancelled" in res.stdout
    # the history, as sacct: both runs, each with its own GPU-seconds and how it ended
    rows = {r["id"]: r for r in wait_for_history(cluster, {j["id"] for j in runs})}
    assert [rows[j["id"]]["state"] for j in runs] == ["cancelled", "finished"]
    assert rows[runs[0]["id"]]["reason"] == f"cancelled by {asker}" and rows[runs[0]["id"]]["user"] == asker
    assert [rows[j["id"]]["gpu_s"] for j in runs] == pytest.approx([j["gpu_s"] for j in runs], rel=1e-6)
    mine = json.loads(cluster.rlix("history", "--json", "--user", asker.split("@")[0], "--since", "1h").stdout)
    assert {j["id"] for j in runs} <= {r["id"] for r in mine}
    assert json.loads(cluster.rlix("history", "--json", "--user", "nobody").stdout) == []
    detail = cluster.rlix("status", runs[1]["id"])
    assert detail.returncode == 0 and "finished" in detail.stdout and "PHASE" in detail.stdout, detail.stderr
    assert all(j["log"].endswith(f":{tmp_path / 'out_long' / j['id'] / 'rlix-run.log'}") for j in runs), runs


def test_a_detached_run_goes_on_without_its_terminal_and_rlix_logs_follows_it(cluster, tmp_path):
    away = write_config(tmp_path / "away.yaml", [{**job("lam", "2-3", steps=3), "checkpoint_dir": str(tmp_path / "ck")}])
    cmd = [sys.executable, "-m", "rlix.exec.front.cli", str(away), "--address", cluster.address, "--detach"]
    t = time.time()
    res = subprocess.run(cmd, capture_output=True, text=True, env=cluster.env, timeout=180, cwd=tmp_path)
    print(f"rlix-run --detach returned in {time.time() - t:.1f} s")
    assert res.returncode == 0, res.stderr[-2000:]
    job_id = re.search(r"lam as (lam#\d+)", res.stdout).group(1)
    assert f"outputs in {tmp_path / 'out_away' / job_id} there" in res.stdout
    # its submitting process has exited; the run goes on, and rlix logs --follow prints its lines until it ends
    logs = cluster.rlix("logs", job_id, "--follow", timeout=300)
    assert logs.returncode == 0 and "lam: finished steps=3/3" in logs.stdout, logs.stdout[-2000:] + logs.stderr[-2000:]
    assert all(line.split(" ", 2)[1] == "lam:" for line in logs.stdout.splitlines())
    (row,) = wait_for_history(cluster, {job_id})
    assert row["state"] == "finished" and row["config"].endswith(f":{away}")
    assert json.loads((tmp_path / "out_away" / job_id / "metrics.json").read_text())["executor"]["shared"]
    (console,) = (tmp_path / "out_away").glob("detached-*.out")  # its last line: the run's exit status
    deadline = time.time() + 60
    while "rlix-run: exited" not in console.read_text():  # written as the run's process ends
        assert time.time() < deadline, console.read_text()[-2000:]
        time.sleep(0.5)
    assert console.read_text().splitlines()[-1] == "rlix-run: exited with status 0"
    missing = cluster.rlix("logs", "nobody")
    assert missing.returncode == 2 and "no job 'nobody'" in missing.stderr and "Traceback" not in missing.stderr
    # Run again: its checkpoint holds all 3 steps, so it starts nothing, and the scheduler records it finished
    # (before: its trainer claimed GPUs for a model load and found nothing to train).
    again = cluster.submit(away)
    assert again.wait(timeout=120) == 0, (tmp_path / "away.err").read_text()[-2000:]
    assert "lam: finished steps=3/3 (resumed at step 3)" in (tmp_path / "away.out").read_text()
    rerun_id = re.search(r"lam as (lam#\d+)", (tmp_path / "away.err").read_text()).group(1)
    (row,) = wait_for_history(cluster, {rerun_id})
    assert row["state"] == "finished" and rerun_id != job_id


def test_timeline_and_an_address_with_no_cluster(cluster, tmp_path):
    # status over the scheduler's HTTP page (the file on this, its node, says where) and through Ray say the same
    fast, _ = cluster.status()
    elsewhere = cluster.rlix("status", "--json", env={"HOME": str(tmp_path)})  # no page file there: through Ray
    assert elsewhere.returncode == 0, elsewhere.stderr[-2000:]
    through_ray = json.loads(elsewhere.stdout)
    assert [(j["id"], j["state"]) for j in through_ray["jobs"]] == [(j["id"], j["state"]) for j in fast["jobs"]]
    png = tmp_path / "cluster.png"
    res = cluster.rlix("timeline", "--plot", str(png))
    assert res.returncode == 0 and png.stat().st_size > 10_000, res.stderr
    status, _ = cluster.status()  # nothing runs now: the chart holds every busy GPU-second since it starts
    res = cluster.rlix("timeline")
    timeline = json.loads(res.stdout)
    segments = timeline["segments"]
    assert timeline["utilization"] == pytest.approx(status["utilization"], abs=0.01)  # one definition, read moments apart
    # the chart starts at the scheduler's last (re)start; the GPU-seconds of a job submitted since are all on it, by id
    since = [j for j in status["jobs"] if j["phases"][0][1] >= timeline["start_s"]]
    assert since and all(j["state"] in ("finished", "failed", "cancelled") for j in since)
    for j in status["jobs"]:
        on_chart = sum(s["end"] - s["start"] for s in segments if s["job"] == j["id"])
        assert on_chart == pytest.approx(j["gpu_s"], abs=1e-6) if j in since else on_chart <= j["gpu_s"] + 1e-6
    nowhere = ServiceCluster(tmp_path)
    res = nowhere.rlix("status")
    assert res.returncode == 2 and "no Ray cluster answers there" in res.stderr.strip().splitlines()[-1]
    assert "Traceback" not in res.stderr


def test_a_forced_stop_cancels_the_running_jobs_first(cluster, tmp_path):
    last = write_config(tmp_path / "last.yaml", [job("kappa", "0-1", steps=1000)])
    p = cluster.submit(last)
    wait_for(lambda s: jobs_by_name(s).get("kappa", {}).get("state") in ("loading", "running"), cluster, 120)
    res = cluster.rlix("scheduler", "stop", "--force")
    assert res.returncode == 0 and "rlix scheduler stopped (1 job cancelled)" in res.stdout, res.stderr[-2000:]
    assert p.wait(timeout=120) == 4 and "kappa: cancelled" in last.with_suffix(".out").read_text()
    assert f"rlix-run: job kappa: the rlix scheduler was stopped by {protocol.asker()}" in last.with_suffix(".err").read_text()
    res = cluster.rlix("status")
    assert res.returncode == 2 and "no rlix scheduler runs on the Ray cluster" in res.stderr
