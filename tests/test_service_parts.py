"""The scheduler service's parts without Ray: the job records, GPU accounting, status, metrics and history."""

from __future__ import annotations

import contextlib
import json
import re
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from rlix.exec.service.jobs import ENDED, MOVES, IllegalMove, JobLedger, Phase
from rlix.exec.service.prom import Metrics, samples
from rlix.exec.service.roster import Roster
from rlix.exec.service.usage import ClusterUsage
from rlix.metrics import Activity
from rlix.protocol import ClusterStatus, JobClaim, JobNote, JobRow, NameTaken, Outcome, Stopped

ROOT = Path(__file__).resolve().parent.parent
W = Activity.WORK


def c(name: str, priority: int, steps: int, job_id: str = "") -> JobClaim:
    return JobClaim(name=name, priority=priority, steps=steps, id=job_id)


def phases(ledger: JobLedger) -> dict[str, str]:
    return {r.id: r.phase.value for r in ledger.records.values()}


def test_every_submission_gets_its_own_id_and_names_are_unique_until_their_job_ends():
    jobs = JobLedger(lease_s=10)
    assert jobs.claim("s1", "ann@h", (c("a", 0, 5), c("b", 1, 3)), set(), 0.0) == ("a#1", "b#2")
    with pytest.raises(NameTaken, match=r"job 'a' is already on this cluster \(a#1, submitted by ann@h\)"):
        jobs.claim("s2", "bob@h", (c("c", 0, 1), c("a", 0, 1)), set(), 1.0)
    assert phases(jobs) == {"a#1": "submitted", "b#2": "submitted"}  # nothing of a refused claim is kept
    with pytest.raises(NameTaken, match="already running"):  # an external pipeline's name, never claimed
        jobs.claim("s2", "bob@h", (c("ext", 0, 1),), {"ext"}, 1.0)
    jobs.registering("a", "s1", "ann@h", 0, 1.0)
    jobs.end("a", Outcome.FINISHED, "", 2.0)
    assert jobs.claim("s2", "bob@h", (c("a", 0, 7),), set(), 3.0) == ("a#3",)  # the name runs again, a new job
    assert phases(jobs) == {"a#1": "finished", "b#2": "submitted", "a#3": "submitted"}
    assert jobs.open_jobs() == ["b", "a"] and jobs.find("a").id == "a#3" and jobs.find("a#1").user == "ann@h"
    assert jobs.id_of("a") == "a#3"


def test_a_job_moves_only_as_its_phase_table_allows():
    jobs = JobLedger(lease_s=10)
    jobs.claim("s1", "ann@h", (c("a", 0, 5),), set(), 0.0)
    record = jobs.find("a")
    with pytest.raises(IllegalMove, match="submitted -> running"):
        record.move(Phase.RUNNING, 1.0)
    jobs.registering("a", "s1", "ann@h", 0, 1.0)
    jobs.noted(JobNote(pipeline_id="a", loaded=True, steps_done=0, steps_total=5), 1.5)  # no GPUs yet: not running
    assert record.phase is Phase.QUEUED
    jobs.granted("a", 2.0)
    jobs.noted(JobNote(pipeline_id="a", loaded=True, steps_done=1, steps_total=5), 3.0)
    jobs.end("a", Outcome.FINISHED, "", 4.0)
    assert record.phases == [("submitted", 0.0), ("queued", 1.0), ("loading", 2.0), ("running", 3.0), ("finished", 4.0)]
    for later in (Phase.RUNNING, Phase.FAILED, Phase.QUEUED):
        with pytest.raises(IllegalMove):
            record.move(later, 5.0)
    assert all(not MOVES[p] for p in ENDED) and Phase.SUBMITTED not in set().union(*MOVES.values())


def test_a_renewal_keeps_what_the_submitter_claimed_and_takes_back_rejoined_jobs_under_their_ids():
    jobs = JobLedger(lease_s=10)
    (a,) = jobs.claim("s1", "ann@h", (c("a", 0, 5),), set(), 0.0)
    jobs.end("a", Outcome.FINISHED, "", 0.5)
    jobs.renew_claims("s1", "ann@h", (c("a", 0, 5, a),), 1.0)
    assert phases(jobs) == {a: "finished"}  # a renewal does not make an ended job look new
    fresh = JobLedger(lease_s=10)  # the service restarted: its running job rejoined, unclaimed
    with pytest.raises(NameTaken):
        fresh.claim("s2", "bob@h", (c("a", 0, 5),), {"a"}, 0.0)
    fresh.renew_claims("s1", "ann@h", (c("b", 0, 5, "b#7"),), 0.0)
    assert fresh.find("b").id == "b#7" and fresh.find("b").submitter == "s1"


def test_a_run_says_where_its_log_is_once_it_has_its_ids_and_only_for_its_own_jobs():
    import dataclasses

    jobs = JobLedger(lease_s=10)
    a, b = jobs.claim("s1", "ann@h", (c("a", 0, 5), c("b", 0, 5)), set(), 0.0)
    assert jobs.find(a).log == jobs.find(b).log == ""
    log = f"host:/runs/{a}/rlix-run.log"
    jobs.renew_claims("s1", "ann@h", tuple(dataclasses.replace(c(n, 0, 5, i), log=log) for n, i in (("a", a), ("b", b))), 1.0)
    assert jobs.find(a).log == jobs.find(b).log == log
    jobs.renew_claims("s2", "bob@h", (dataclasses.replace(c("a", 0, 5, a), log="host:/elsewhere"),), 2.0)
    assert jobs.find(a).log == log  # another submitter's renewal does not move it


def test_a_renewal_never_fails_on_a_name_another_submitter_took_after_its_job_ended():
    jobs = JobLedger(lease_s=10)
    a, b = jobs.claim("s1", "ann@h", (c("a", 0, 5), c("b", 0, 5)), set(), 0.0)
    jobs.end("a", Outcome.FINISHED, "", 0.5)
    (a2,) = jobs.claim("s2", "bob@h", (c("a", 0, 3),), set(), 1.0)  # a new job of the ended name
    jobs.renew_claims("s1", "ann@h", (c("a", 0, 5, a), c("b", 0, 5, b)), 12.0)  # s1 still lists a: the renewal holds
    jobs.renew_claims("s2", "bob@h", (c("a", 0, 3, a2),), 12.0)
    assert jobs.expired(20.0) == [] and jobs.find("a").submitter == "s2" and jobs.find("b").submitter == "s1"


def test_a_registering_pipeline_cannot_take_a_name_another_submitter_claimed():
    jobs = JobLedger(lease_s=10)
    jobs.claim("s1", "ann@h", (c("a", 0, 5), c("c", 0, 5)), set(), 0.0)
    with pytest.raises(NameTaken, match="submitted by ann@h"):
        jobs.registering("a", "", "bob@h", 0, 1.0)  # an external pipeline
    with pytest.raises(NameTaken, match="submitted by ann@h"):
        jobs.registering("a", "s2", "bob@h", 0, 1.0)
    jobs.registering("a", "s1", "ann@h", 0, 1.0)  # the submitter's own coordinator
    jobs.cancelled("c", Stopped(by="ann@h"), 1.0)
    with pytest.raises(NameTaken, match="cancelled before it started"):
        jobs.registering("c", "s1", "ann@h", 0, 2.0)
    jobs.end("a", Outcome.FINISHED, "", 2.0)
    record = jobs.registering("a", "", "bob@h", 0, 3.0)  # once its job ended, the name may run again: a new job
    assert record.id == "a#3" and record.phase is Phase.QUEUED and jobs.find("a#1").phase is Phase.FINISHED


def test_leases_lapse_and_cancels_reach_their_submitter():
    jobs = JobLedger(lease_s=10)
    jobs.claim("s1", "ann@h", (c("a", 0, 5),), set(), 0.0)
    jobs.claim("s2", "bob@h", (c("b", 0, 5),), set(), 0.0)
    jobs.cancelled("b", Stopped(by="ann@h"), 1.0)
    assert jobs.renew("s1", 5.0) == () and jobs.renew("s2", 5.0) == (("b", Stopped(by="ann@h")),)
    assert jobs.find("b").error == "cancelled by ann@h"
    jobs.renew("s1", 12.0)
    assert jobs.expired(16.0) == ["s2"] and jobs.jobs_of("s1") == ["a"]
    assert jobs.expired(16.0) == []


def test_gpu_seconds_used_borrowed_and_lent_add_up():
    usage = ClusterUsage(4)
    usage.set_home(0.0, "a", (0, 1))
    usage.set_home(0.0, "b", (2, 3))
    usage.update(0.0, [("a", "rollout", W)] * 4)  # a rolls out on every GPU, b's home included
    usage.update(10.0, [("a", "actor_train", W), ("a", "actor_train", W), ("b", "init", W), None])
    assert usage.busy_gpu_s(20.0) == pytest.approx(40 + 30)
    assert usage.used == pytest.approx({"a": 60.0, "b": 10.0})
    assert usage.borrowed == pytest.approx({"a": 20.0}) and usage.lent == pytest.approx({"b": 20.0})
    rec = usage.timeline(20.0)  # the chart holds the same GPU-seconds, by job
    assert sum(e - s for _, s, e, *_ in rec.segments) == pytest.approx(70.0)
    usage.update(30.0, [None] * 4)  # the live recorder went on past the copy
    assert sum(e - s for _, s, e, *_ in usage.recorder.segments) == pytest.approx(70.0 + 30.0)


def test_overlapping_homes_share_what_they_lent():
    usage = ClusterUsage(2)
    usage.set_home(0.0, "a", (0, 1))
    usage.set_home(0.0, "b", (0, 1))
    usage.set_home(0.0, "c", ())
    usage.update(0.0, [("c", "rollout", W), None])
    usage.integrate(10.0)
    assert usage.lent == pytest.approx({"a": 5.0, "b": 5.0}) and usage.borrowed == pytest.approx({"c": 10.0})


def row(name: str, gpus, state="running", tenant: str = "") -> JobRow:
    return JobRow(
        id=f"{name}#1",
        name=name,
        tenant=tenant,
        submitter="s",
        state=state,
        priority=0,
        gpus=tuple(gpus),
        steps_done=1,
        steps_total=2,
        gpu_s=3.0,
        lent_s=1.0,
        borrowed_s=0.5,
        queue_position=None,
    )


def status(*rows: JobRow) -> ClusterStatus:
    return ClusterStatus(
        nodes=1,
        gpus_per_node=4,
        policy="rlix",
        uptime_s=10,
        busy_gpu_s=20,
        utilization=0.5,
        idle_fraction=0.5,
        queue_length=1,
        jobs=rows,
    )


def test_rlix_status_of_one_job_with_watch_refreshes_until_ctrl_c():
    """Before: ``rlix status JOB --watch`` printed the job once and returned."""
    import argparse

    from rlix.exec.service.cli import _status

    reads = []

    def read():
        reads.append(1)
        if len(reads) == 3:
            raise KeyboardInterrupt
        return status(row("a", [(0, "rollout")]))

    args = argparse.Namespace(job="a", watch=0.01, json=False)
    assert _status(read, args) == 0 and len(reads) == 3  # the first view, one refresh, then Ctrl-C


def test_the_metrics_page_is_prometheus_text_of_the_status_by_job_id():
    first = samples(status(row("a", [(0, "rollout"), (1, "rollout"), (2, "actor_train")]), row("b", [], "queued")))
    values = {(n, t): v for n, t, v in first}
    assert values[("rlix_gpus_held", (("job", "a#1"), ("stage", "rollout")))] == 2  # series by job id
    assert values[("rlix_gpus_held", (("job", "a#1"), ("stage", "actor_train")))] == 1
    assert values[("rlix_idle_gpus", ())] == 1 and values[("rlix_gpus_total", ())] == 4
    assert values[("rlix_jobs", (("state", "running"),))] == 1 and values[("rlix_jobs", (("state", "queued"),))] == 1
    assert values[("rlix_job_gpu_seconds", (("job", "a#1"), ("kind", "lent")))] == 1.0
    metrics = Metrics({"a#1": 3})
    for seconds in (0.0001, 0.003, 7.0):
        metrics.plan_latency.observe(seconds)
    lines = metrics.text(status(row("a", [(0, "rollout")]))).splitlines()
    assert lines[:3] == [
        "# HELP rlix_gpus_held GPUs a job holds now, by stage",
        "# TYPE rlix_gpus_held gauge",
        'rlix_gpus_held{job="a#1",stage="rollout"} 1.0',
    ]
    assert 'rlix_preemptions_total{job="a#1"} 3.0' in lines and "# TYPE rlix_preemptions_total counter" in lines
    buckets = [line for line in lines if line.startswith("rlix_plan_latency_seconds_bucket")]
    assert buckets[0] == 'rlix_plan_latency_seconds_bucket{le="0.0005"} 1.0'  # cumulative, as Prometheus reads them
    assert buckets[-1] == 'rlix_plan_latency_seconds_bucket{le="+Inf"} 3.0' and "rlix_plan_latency_seconds_count 3.0" in lines
    assert sum(line.startswith("# TYPE rlix_plan_latency_seconds ") for line in lines) == 1


def test_the_dashboard_reads_only_metrics_the_service_exports():
    metrics = Metrics({"a#1": 2})
    metrics.plan_latency.observe(0.003)
    page = metrics.text(status(row("a", [(0, "rollout")])))
    exported = {line.split("{")[0].split()[0] for line in page.splitlines() if not line.startswith("#")}
    dash = json.loads((ROOT / "dashboards" / "rlix-grafana.json").read_text())
    used = {m for p in dash["panels"] for t in p["targets"] for m in re.findall(r"\brlix_\w+", t["expr"])}
    assert used and used <= exported, used - exported
    assert {p["title"] for p in dash["panels"]} >= {"GPUs held per job", "Plan latency", "Queue length"}


def test_a_restarted_scheduler_plans_once_every_pipeline_it_had_is_back_or_gone_or_at_its_deadline():
    first = Roster(restarted=False, persist=False, now=0.0, max_wait_s=30.0)
    first.joined("a")
    assert not first.waiting(0.0)  # a first life waits for nobody
    again = Roster(restarted=True, persist=False, now=100.0, max_wait_s=30.0)
    again.expected = {"a", "b"}  # what the previous life had registered (read back from Ray's store in an actor)
    assert again.waiting(101.0)
    again.joined("a")
    assert again.waiting(102.0)
    again.left("b")  # gone (dropped, or it ended) instead of rejoining
    assert not again.waiting(103.0) and again.pipelines == {"a": None}
    late = Roster(restarted=True, persist=False, now=0.0, max_wait_s=30.0)
    late.expected = {"c"}
    assert late.waiting(29.9) and not late.waiting(30.0)


def test_a_restarted_scheduler_reads_back_which_pipelines_it_had_dropped_while_they_ran(monkeypatch):
    """What a life keeps in Ray's key-value store (faked here: the store is the process boundary) tells the
    next life which of its pipelines were dropped; one that left since is no longer dropped."""
    from rlix.exec.service import roster

    store: dict[str, str] = {}
    monkeypatch.setattr(roster, "keep", lambda key, value: store.__setitem__(key, json.dumps(value)))
    monkeypatch.setattr(roster, "kept", lambda key: json.loads(store[key]) if key in store else None)
    first = Roster(restarted=False, persist=True, now=0.0, max_wait_s=30.0)
    for pid in ("a", "b", "c"):
        first.joined(pid)
    first.drop("a")
    first.drop("b")
    first.left("b")
    again = Roster(restarted=True, persist=True, now=100.0, max_wait_s=30.0)
    assert again.before == {"a": None, "c": None} and again.expected == {"a", "c"}
    assert again.was_dropped("a") and not again.was_dropped("b") and not again.was_dropped("c")
    fresh = Roster(restarted=False, persist=True, now=0.0, max_wait_s=30.0)  # a first life reads nothing back
    assert fresh.before == {} and not fresh.was_dropped("a")
    # A second restart still waits for a pipeline the first did not hear from, and knows it was dropped;
    # a new job that took the name of one that never came back is not.
    again.joined("c")
    third = Roster(restarted=True, persist=True, now=200.0, max_wait_s=30.0)
    assert third.expected == {"a", "c"} and third.was_dropped("a")
    third.joined("a")  # a new registration under the name, not a rejoin
    fourth = Roster(restarted=True, persist=True, now=300.0, max_wait_s=30.0)
    assert fourth.expected == {"a", "c"} and not fourth.was_dropped("a")


def test_the_status_table_shows_tenants_where_jobs_name_them():
    from rich.console import Console

    from rlix.exec.service.show import status_table

    def shown(*rows: JobRow) -> list[str]:
        console = Console(width=200, record=True)
        status_table(status(*rows), console)
        return [" ".join(w for w in line.split() if w not in "┃│") for line in console.export_text().splitlines()]

    assert "TENANT" not in shown(row("a", [(0, "rollout")]))[1]
    lines = shown(row("a", [(0, "rollout")], tenant="research"), row("b", [(1, "rollout")]))
    rows = [line.split() for line in lines if line.split() and line.split()[0] in ("ID", "a#1", "b#1")]
    assert [r[:4] for r in rows] == [
        ["ID", "NAME", "TENANT", "STATE"],
        ["a#1", "a", "research", "running"],
        ["b#1", "b", "-", "running"],
    ]


def test_the_history_keeps_each_ended_job_once_by_id_and_reads_back_as_sacct_would(tmp_path):
    from rlix.exec.service.history import History, history_row

    jobs, usage = JobLedger(lease_s=10), ClusterUsage(2)
    first = jobs.claim("s1", "ann@h", (JobClaim(name="a", priority=0, steps=5, config="h:/a.yaml"),), set(), 0.0)
    jobs.registering("a", "s1", "ann@h", 0, 1.0)
    jobs.granted("a", 2.0)
    usage.update(2.0, [("a#1", "init", W), None])
    jobs.end("a", Outcome.FAILED, "ActorDiedError", 12.0)
    usage.update(12.0, [None, None])
    jobs.claim("s2", "bob@h", (c("a", 0, 3),), set(), 13.0)
    jobs.end("a", Outcome.CANCELLED, "cancelled by ann@h", 20.0)
    db = History(tmp_path / "rlix" / "history.sqlite")
    for record in jobs.records.values():
        db.write(history_row(record, usage, t0=1000.0))
    db.write(history_row(jobs.find("a#1"), usage, t0=1000.0))  # written again: replaced, not doubled
    again = History(tmp_path / "rlix" / "history.sqlite")  # another process (a restarted scheduler) reads the file
    rows = again.query()
    assert [(r.id, r.state, r.user) for r in rows] == [("a#1", "failed", "ann@h"), ("a#2", "cancelled", "bob@h")]
    assert first == ("a#1",) and rows[0].config == "h:/a.yaml" and rows[0].reason == "ActorDiedError"
    assert rows[0].gpu_s == pytest.approx(10.0) and rows[1].gpu_s == 0.0
    assert rows[0].phases == (("submitted", 1000.0), ("queued", 1001.0), ("loading", 1002.0), ("failed", 1012.0))
    assert [r.id for r in again.query(user="bob")] == ["a#2"] and again.query(user="ann@h")[0].id == "a#1"
    assert [r.id for r in again.query(since=1015.0)] == ["a#2"]
    assert again.find("a#1").id == "a#1" and again.find("a").id == "a#2" and again.find("zz") is None  # a name: its last


def test_a_history_written_before_it_kept_logs_is_read_and_gains_the_column(tmp_path):
    import sqlite3

    from rlix.exec.service.history import SCHEMA, History

    path = tmp_path / "old.sqlite"
    old = sqlite3.connect(path)
    old.execute(SCHEMA.replace(",\n    log TEXT NOT NULL DEFAULT ''", ""))  # the table as an earlier rlix made it
    old.execute("INSERT INTO jobs VALUES ('a#1','a','ann@h','s1','','finished','',1.0,2.0,'[]',1,1,0.5,0.0,0.0)")
    old.commit()
    assert [(r.id, r.log) for r in History(path, readonly=True).query()] == [("a#1", "")]  # read as it is
    assert not any(name == "log" for _, name, *_ in old.execute("PRAGMA table_info(jobs)"))
    db = History(path)  # the scheduler opens it: the column is added, the rows kept
    assert any(name == "log" for _, name, *_ in old.execute("PRAGMA table_info(jobs)"))
    assert db.find("a#1").gpu_s == 0.5 and db.find("a#1").log == ""


def test_an_ended_job_is_forgotten_a_while_after_it_is_in_the_history_and_the_figures_still_add_up(tmp_path):
    from rich.console import Console

    from rlix.core import ClusterSpec, Scheduler, SchedulingError
    from rlix.exec.service.books import Books
    from rlix.exec.service.history import History
    from rlix.exec.service.show import status_view
    from rlix.exec.service.status import cluster_status

    core = Scheduler(ClusterSpec(nodes=1, gpus_per_node=2), policy="rlix")
    history = str(tmp_path / "h.sqlite")
    books = Books(2, t0=1000.0, now=0.0, restarts=0, persist=False, lease_s=10, history=history, keep_ended_s=60)
    jobs, usage = books.jobs, books.usage
    jobs.claim("s1", "ann@h", (c("a", 0, 5), c("b", 0, 5)), set(), 0.0)
    for name in ("a", "b"):
        jobs.registering(name, "s1", "ann@h", 0, 1.0)
        jobs.granted(name, 1.0)
    usage.update(1.0, [("a#1", "rollout", W), ("b#2", "rollout", W)])
    usage.set_home(1.0, "a#1", (0,))
    jobs.end("a", Outcome.FINISHED, "", 11.0)
    usage.update(11.0, [None, ("b#2", "rollout", W)])
    books.metrics.preemptions["a#1"] += 2
    (tmp_path / "rlix-run.log").write_text("12:00:00 a: finished steps=5/5\n")
    jobs.find("a#1").log = f"{socket.gethostname()}:{tmp_path / 'rlix-run.log'}"
    books.write_history(core, 12.0)  # a is in the history from 12 s (the core's ledger holds nothing: b is booked by hand)
    usage.update(12.0, [None, ("b#2", "rollout", W)])
    assert books.forget_ended(71.9) == [] and {r.id for r in cluster_status(books, core, 71.9).jobs} == {"a#1", "b#2"}
    assert books.forget_ended(72.0) == []  # its pipeline has not left (its home is still booked): not yet
    usage.set_home(72.0, "a#1", ())
    assert books.forget_ended(72.0) == ["a#1"]
    status = cluster_status(books, core, 80.0)
    assert [r.id for r in status.jobs] == ["b#2"] and (status.forgotten_jobs, status.forgotten_gpu_s) == (1, pytest.approx(10.0))
    assert status.busy_gpu_s == pytest.approx(sum(r.gpu_s for r in status.jobs) + status.forgotten_gpu_s)
    assert status.busy_gpu_s == pytest.approx(10.0 + 79.0)  # a's 10 s kept; b held GPU 1 from 1 s
    assert "a#1" not in books.metrics.preemptions and "a#1" not in usage.fair and "a" not in jobs.by_name
    jobs.renew_claims("s1", "ann@h", (c("a", 0, 5, job_id="a#1"),), 80.0)  # a late renewal naming it: not brought back
    assert "a#1" not in jobs.records
    assert [r.id for r in History(tmp_path / "h.sqlite").query()] == ["a#1"]  # the history has it
    chunk = books.read_log("a#1")  # forgotten here: its history row says where its run's log is
    assert chunk.found and chunk.ended and chunk.text == "12:00:00 a: finished steps=5/5\n"
    with pytest.raises(SchedulingError, match="no job 'zz'"):
        books.read_log("zz")
    assert jobs.find("a") is None and jobs.claim("s1", "ann@h", (c("a", 0, 1),), set(), 81.0) == ("a#3",)  # ids go on
    with pytest.raises(IllegalMove, match="b#2 is loading: only an ended job is forgotten"):
        jobs.forget("b#2")
    again = ClusterUsage(2, start=0.0, totals=usage.totals(82.0))  # a restarted service goes on from the totals
    assert (again.forgotten_jobs, again.busy_gpu_s(0.0)) == (1, pytest.approx(usage.busy_gpu_s(82.0)))

    console = Console(width=200, record=True)
    console.print(status_view(status))
    assert "1 job ended earlier, in rlix history" in console.export_text()


def test_a_restarted_service_forgets_the_figures_of_jobs_its_earlier_life_saw_end_and_still_adds_up(tmp_path, monkeypatch):
    from rlix.core import ClusterSpec, Scheduler
    from rlix.exec.service.books import Books
    from rlix.exec.service.status import cluster_status

    store: dict = {}  # Ray's internal key-value store (the process boundary)
    for module in ("jobs", "books"):
        monkeypatch.setattr(f"rlix.exec.service.{module}.keep", lambda k, v: store.__setitem__(k, json.loads(json.dumps(v))))
        monkeypatch.setattr(f"rlix.exec.service.{module}.kept", lambda k: store.get(k))
    core, history = Scheduler(ClusterSpec(nodes=1, gpus_per_node=2), policy="rlix"), str(tmp_path / "h.sqlite")
    books = Books(2, t0=1000.0, now=0.0, restarts=0, persist=True, lease_s=10, history=history)
    books.jobs.claim("s1", "ann@h", (c("a", 0, 5), c("b", 0, 5)), set(), 0.0)
    for name in ("a", "b"):
        books.jobs.registering(name, "s1", "ann@h", 0, 1.0)
    books.usage.update(1.0, [("a#1", "rollout", W), ("b#2", "rollout", W)])
    books.metrics.preemptions["a#1"] += 1
    books.jobs.end("a", Outcome.FINISHED, "", 11.0)  # a ended; the service dies before a is in the history
    books.usage.update(11.0, [None, ("b#2", "rollout", W)])
    books.keep_totals(20.0)
    again = Books(2, t0=1000.0, now=30.0, restarts=1, persist=True, lease_s=10, history=history)
    status = cluster_status(again, core, 30.0)
    assert [r.id for r in status.jobs] == ["b#2"] and (status.forgotten_jobs, status.forgotten_gpu_s) == (1, pytest.approx(10.0))
    assert status.busy_gpu_s == pytest.approx(sum(r.gpu_s for r in status.jobs) + status.forgotten_gpu_s)
    assert dict(again.metrics.preemptions) == {}


def test_keep_ended_takes_an_age():
    import argparse

    from rlix.exec.service.cli import build_parser, duration

    assert [duration(t) for t in ("600", "30m", "1.5h", "2d", "0")] == [600.0, 1800.0, 5400.0, 172800.0, 0.0]
    with pytest.raises(argparse.ArgumentTypeError, match="-5 is not an age"):
        duration("-5")
    assert build_parser().parse_args(["scheduler", "start", "--keep-ended", "10m"]).keep_ended == 600.0
    assert build_parser().parse_args(["scheduler", "start"]).keep_ended == 3600.0
    with pytest.raises(SystemExit):  # argparse's one line and exit 2: shorter than a submitter's renewals
        build_parser().parse_args(["scheduler", "start", "--keep-ended", "30"])


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["status", "--watch", "-1"],
            "rlix status: error: argument --watch: -1 is not a number of seconds above 0",
        ),
        (["status", "--watch", "inf"], "rlix status: error: argument --watch: inf is not a number of seconds"),
        (["logs"], "rlix logs: error: the following arguments are required: job (see 'rlix logs --help')"),
        (["status", "--address", ""], "rlix status: error: argument --address: is empty"),
        (["status", "--address", "not an address"], "rlix status: error: argument --address: 'not an address' is not an"),
        (["scheduler", "start", "--nodes", "0", "--gpus", "4"], "rlix scheduler start: error: argument --nodes: 0 is not"),
        (["scheduler", "start", "--nodes", "1", "--gpus", "4", "--set", "tenants=a:1:99"], "rlix: --set tenants: their"),
        (["scheduler", "start", "--nodes", "1000", "--gpus", "1000"], "rlix: --nodes x --gpus: cluster: 1000 nodes x 1000 GPUs"),
    ],
)
def test_the_rlix_tool_refuses_bad_flags_in_one_line_before_joining_ray(args, expected, capsys):
    """Before: argparse's usage line and its error; ``scheduler start`` joined Ray, then started a service
    the core refused (or read the cluster from Ray for --nodes 0)."""
    from rlix.exec.service.cli import main

    with pytest.raises(SystemExit) if "error:" in expected else contextlib.nullcontext():
        assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith(expected), err


def test_a_cluster_too_large_is_named_by_where_it_came_from():
    """A cluster read from Ray is no flag the user gave: the refusal says so."""
    from rlix.core import ClusterSpec
    from rlix.exec.service.cli import _knobs, settings_error

    huge, fits = ClusterSpec(nodes=1000, gpus_per_node=1000), ClusterSpec(nodes=1, gpus_per_node=4)
    assert settings_error(huge, _knobs([])).startswith("--nodes x --gpus: cluster: 1000 nodes x 1000 GPUs")
    assert settings_error(huge, _knobs([]), source="the Ray cluster's GPUs").startswith("the Ray cluster's GPUs: cluster:")
    assert settings_error(fits, _knobs([])) is None


def test_rlix_history_reads_the_file_itself_without_ray(tmp_path):
    import subprocess
    import sys

    from rlix.exec.service.history import History, history_row

    jobs = JobLedger(lease_s=10)
    jobs.claim("s1", "ann@h", (c("b", 0, 5),), set(), 0.0)
    jobs.end("b", Outcome.CANCELLED, "cancelled by ann@h", 3.0)
    path = tmp_path / "h.sqlite"
    History(path).write(history_row(jobs.find("b"), ClusterUsage(1), t0=1e9))
    cmd = [sys.executable, "-m", "rlix.exec.service.cli", "history", "--db", str(path)]
    listed = json.loads(subprocess.run([*cmd, "--json"], capture_output=True, text=True, check=True).stdout)
    assert [(r["id"], r["state"], r["reason"]) for r in listed] == [("b#1", "cancelled", "cancelled by ann@h")]
    table = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert "b#1" in table and "cancelled (cancelled by ann@h)" in table and "ELAPSED" in table
    bad = subprocess.run([*cmd, "--since", "soon"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("rlix: --since soon:") and "Traceback" not in bad.stderr


def test_a_restarted_ledger_keeps_ids_counting_leases_running_and_ends_jobs_that_did_not_come_back(monkeypatch):
    store: dict = {}  # Ray's internal key-value store (the process boundary)
    monkeypatch.setattr("rlix.exec.service.jobs.keep", lambda key, value: store.__setitem__(key, json.loads(json.dumps(value))))
    monkeypatch.setattr("rlix.exec.service.jobs.kept", lambda key: store.get(key))
    first = JobLedger(lease_s=10, persist=True, counted=7)  # its history holds ids up to #7
    assert first.claim("s1", "ann@h", (c("a", 0, 5), c("b", 0, 5)), set(), 0.0) == ("a#8", "b#9")
    first.registering("a", "s1", "ann@h", 0, 1.0)
    first.registering("b", "s1", "ann@h", 0, 1.0)
    again = JobLedger(lease_s=10, persist=True, restarted=True, now=50.0)
    assert phases(again) == {"a#8": "queued", "b#9": "queued"} and again.find("a").user == "ann@h"
    again.rejoined("a", "ann@h", True, 51.0)  # a came back; b's pipeline did not
    assert again.unjoined({"a"}, 80.0) == ["b"]
    assert phases(again) == {"a#8": "loading", "b#9": "failed"}
    assert again.find("b").error == "it did not rejoin the restarted scheduler"
    assert again.expired(70.0) == ["s1"]  # its submitter never renewed after the restart: its lease lapsed
    assert again.claim("s2", "bob@h", (c("b", 0, 1),), {"a"}, 81.0) == ("b#10",)  # ids go on counting
    assert JobLedger(lease_s=10, persist=True, now=0.0).count == 10  # a new service on the cluster: still on


def test_a_pipeline_goes_by_its_name_even_where_another_job_has_that_id():
    jobs = JobLedger(lease_s=10)
    jobs.claim("s1", "ann@h", (c("exp", 0, 5),), set(), 0.0)
    jobs.registering("exp", "s1", "ann@h", 0, 1.0)
    odd = jobs.registering("exp#1", "", "bob@h", 0, 2.0)  # an outside pipeline named like exp's id
    assert jobs.id_of("exp#1") == odd.id == "exp#1#2" and jobs.id_of("exp") == "exp#1"
    assert jobs.find("exp#1") is odd  # a name first


@pytest.mark.exec
def test_a_run_log_has_a_line_per_change_and_a_jobs_lines_are_read_whole(tmp_path):
    from rlix.exec.config import load_config
    from rlix.exec.front.api import _Pipeline
    from rlix.exec.front.runlog import RunLog
    from rlix.exec.messages import JobResult
    from rlix.exec.records import JobStatus
    from rlix.exec.service.logs import NAME, chunk_here, lines_of, read_chunk

    cfg = load_config(ROOT / "examples" / "cpu_two_jobs.yaml")
    pipes = {j.name: _Pipeline(pipeline_id=j.name, job=j) for j in cfg.jobs}
    first, second = sorted(pipes)
    session = SimpleNamespace(pipelines=pipes, now=lambda: 0.0)
    log = RunLog(tmp_path)
    log(session)
    log(session)  # nothing changed: nothing written
    pipes[first].result = JobResult(pipeline_id=first, status=JobStatus.FINISHED, steps_planned=2, finish_s=5.0)
    log(session)
    log.close()
    path = tmp_path / NAME
    text, offset = read_chunk(path, 0)
    assert [line.split(" ", 1)[1] for line in lines_of(text, first)] == [
        f"{first}: queued steps=0/{pipes[first].job.steps} reward -",
        f"{first}: finished steps=0/2 reward - jct_s=5.0",
    ]
    assert len(lines_of(text, second)) == 1 and offset == path.stat().st_size
    with open(path, "a") as f:
        f.write(f"12:00:00 {second}: half a li")  # a line being written is not read yet
    assert read_chunk(path, offset) == ("", offset)
    here = chunk_here(f"{socket.gethostname()}:{path}", 0, ended=True)
    assert here.found and here.text == text and here.ended
    assert not chunk_here(f"elsewhere:{path}", 0, ended=False).found


class _SaysEnded:
    """The scheduler (across Ray, so faked here) answering status: the job has ended, its log on this host."""

    def __init__(self, log: str) -> None:
        self.row = SimpleNamespace(id="lam#1", name="lam", log=log, state="finished")

    def call_sync(self, request):
        return SimpleNamespace(jobs=[self.row])


def test_logs_of_a_job_the_status_has_forgotten_come_through_its_history_row(tmp_path, capsys):
    from rlix import protocol
    from rlix.exec.service import cli

    path = tmp_path / "rlix-run.log"
    path.write_text("12:00:00 lam: finished steps=3/3 reward 0.2 -> 0.3 jct_s=9.0\n12:00:01 mu: running steps=1/3\n")

    class Forgot:
        def call_sync(self, request):
            if isinstance(request, protocol.Status):
                return SimpleNamespace(jobs=[])
            assert isinstance(request, protocol.JobHistory)
            return [SimpleNamespace(id="lam#1", name="lam", log=f"{socket.gethostname()}:{path}", state="finished")]

    assert cli._logs(Forgot(), SimpleNamespace(job="lam", follow=False)) == 0
    assert capsys.readouterr().out.splitlines() == ["12:00:00 lam: finished steps=3/3 reward 0.2 -> 0.3 jct_s=9.0"]
    with pytest.raises(cli.UserError, match="no job 'nobody' on this cluster; see rlix status and rlix history"):
        cli._logs(Forgot(), SimpleNamespace(job="nobody", follow=False))


def test_logs_follow_waits_for_the_last_line_of_a_job_already_ended(tmp_path, capsys, monkeypatch):
    """The scheduler learns a job ended before its run writes the last line (on its next poll): --follow prints it."""
    import threading

    from rlix.exec.service import cli

    path = tmp_path / "rlix-run.log"
    path.write_text("12:00:00 lam: running steps=2/3 reward 0.2 -> 0.2 gpus=2\n")

    def last_line():
        with path.open("a") as f:
            f.write("12:00:02 lam: finished steps=3/3 reward 0.2 -> 0.3 jct_s=9.0\n")

    late = threading.Timer(1.5, last_line)
    late.start()
    args = SimpleNamespace(job="lam#1", follow=True)
    assert cli._logs(_SaysEnded(f"{socket.gethostname()}:{path}"), args) == 0
    late.join()
    assert capsys.readouterr().out.splitlines()[-1].endswith("lam: finished steps=3/3 reward 0.2 -> 0.3 jct_s=9.0")
    # a run that died before its last line: --follow still ends, once it has waited for it
    monkeypatch.setattr(cli, "LAST_LINE_WAIT_S", 0.5)
    path.write_text("12:00:00 lam: running steps=2/3 reward 0.2 -> 0.2 gpus=2\n")
    assert cli._logs(_SaysEnded(f"{socket.gethostname()}:{path}"), args) == 0
    assert capsys.readouterr().out.splitlines() == ["12:00:00 lam: running steps=2/3 reward 0.2 -> 0.2 gpus=2"]


def test_ctrl_c_stops_logs_follow_quietly_with_130(tmp_path, capsys, monkeypatch):
    """Before: Ctrl-C, the way to stop following, ended in a KeyboardInterrupt traceback and exit 1."""
    from rlix.exec.service import cli

    path = tmp_path / "rlix-run.log"
    path.write_text("12:00:00 lam: running steps=2/3 reward 0.2 -> 0.2 gpus=2\n")
    waits = []

    class Running(_SaysEnded):
        def call_sync(self, request):
            if waits:  # the second status read, after a second's wait: the user pressed Ctrl-C
                raise KeyboardInterrupt
            waits.append(request)
            return super().call_sync(request)

    service = Running(f"{socket.gethostname()}:{path}")
    service.row.state = "running"
    monkeypatch.setattr(cli, "_connect", lambda args: service)
    assert cli.main(["logs", "lam#1", "--follow"]) == 130
    out = capsys.readouterr()
    assert out.out.splitlines() == ["12:00:00 lam: running steps=2/3 reward 0.2 -> 0.2 gpus=2"] and out.err == ""
    # a command that changes something says it was cut short, and where to look
    assert cli.main(["cancel", "lam#1"]) == 130
    assert capsys.readouterr().err == "rlix: cancel interrupted; see rlix status for where things stand\n"


def test_a_detached_runs_last_line_says_how_it_ended():
    from rlix.exec.error_text import ending

    assert [ending(c) for c in (0, 3, -9, -200)] == [
        "exited with status 0",
        "exited with status 3",
        "killed by SIGKILL",
        "killed by signal 200",
    ]


# ------------------------------------------------------------------ the cluster a client joins


def test_two_hosts_are_one_machine_by_what_they_resolve_to_or_a_loopback_beside_a_local_address():
    from rlix.transport import _same_host

    assert _same_host("localhost", "127.0.0.1") and _same_host("[FD00::5]", "[fd00::5]")
    assert not _same_host("192.0.2.7", "192.0.2.2")  # two machines of a test network, neither this one
    assert not _same_host("localhost", "192.0.2.7")  # this machine's loopback is not a remote head's
    assert not _same_host("no-such-host.invalid", "192.0.2.2")


@pytest.mark.heavy
def test_a_client_joined_to_one_ray_cluster_refuses_to_connect_to_another_address_in_one_line():
    """A process joined to a Ray cluster already (``ray.init``) that asks for the scheduler at another
    address is told so, rather than handed the service of the cluster it joined."""
    import subprocess
    import sys

    script = """
import ray
from rlix.client import SchedulerGone, connect
from rlix.transport import ClusterError
ray.init(address="local", num_cpus=1, include_dashboard=False)
here = ray.get_runtime_context().gcs_address
port = int(here.rpartition(":")[2])
try:
    connect(f"127.0.0.1:{port + 1}", where="--address")
except ClusterError as exc:
    print("refused:", exc)
try:
    connect(f"127.0.0.1:{port}")  # this cluster, by its loopback: joined, and no service runs on it
except SchedulerGone as exc:
    print("same:", exc)
import warnings
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    try:
        connect(f"192.0.2.7:{port}")  # the same port on another host: maybe this cluster by another name
    except SchedulerGone:
        pass
print("warned:", seen[0].message)
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    refused, same, warned = out.stdout.splitlines()[-3:]
    assert refused.startswith("refused: --address 127.0.0.1:") and "is connected to the Ray cluster at" in refused
    assert "ray.shutdown()" in refused
    assert same.startswith("same: no rlix scheduler runs on this Ray cluster")
    assert warned.startswith("warned: address 192.0.2.7:") and "rlix uses it; call ray.shutdown() first" in warned
