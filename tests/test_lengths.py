"""Prompt ids in traces, the length predictor, and the order it starts trajectories in (rlix.lengths)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlix.lengths import MIN_PAIRS, NOT_STARTED, Group, LengthPredictor, Pearson, PredictedQueue
from rlix.sim.simulator import replay
from rlix.trace import GenerateModel, StreamModel, TraceError, expand_stream, parse_trace


def _generate(**prompts) -> dict:
    raw = dict(steps=6, trajectories_per_step=512, duration=dict(median_s=20, p99_s=200, max_s=400), seed=5)
    if prompts:
        raw["prompts"] = dict(group_size=8, dataset=128, **prompts)
    return raw


def _steps(**prompts):
    return expand_stream(StreamModel(id="s", generate=GenerateModel.model_validate(_generate(**prompts))))


# ------------------------------------------------------------------ the trace format


def test_uncorrelated_prompts_leave_the_drawn_lengths_as_they_were():
    plain, prompted = _steps(), _steps(group_correlation=0.0, epoch_correlation=0.0)
    assert all(np.array_equal(a.trajectories, b.trajectories) for a, b in zip(plain, prompted))
    assert plain[0].prompts is None and prompted[0].prompts is not None


def test_generated_prompts_come_in_groups_and_every_epoch_visits_each_prompt_once():
    steps = _steps(group_correlation=0.5)
    prompts = [s.prompts.reshape(-1, 8) for s in steps]
    assert all((p == p[:, :1]).all() for p in prompts)  # groups of 8 consecutive trajectories
    for step in prompts:
        assert len(set(step[:, 0].tolist())) == 64  # no prompt twice in a step
    visits = np.concatenate([p[:, 0] for p in prompts])  # 6 steps x 64 prompts = 3 epochs of 128
    for epoch in visits.reshape(3, 128):
        assert sorted(epoch.tolist()) == list(range(128))


def test_generated_lengths_correlate_within_a_group_and_across_epochs_as_asked():
    steps = expand_stream(
        StreamModel(
            id="s",
            generate=GenerateModel.model_validate(
                {**_generate(group_correlation=0.7, epoch_correlation=0.4), "steps": 40, "duration": dict(median_s=20, p99_s=200)}
            ),
        )
    )
    logs = np.concatenate([np.log(s.trajectories).reshape(-1, 8) for s in steps])
    assert np.corrcoef(logs[:, 0], logs[:, 1])[0, 1] == pytest.approx(0.7, abs=0.05)
    by_prompt: dict[int, list[float]] = {}
    for s in steps:
        for prompt, length in zip(s.prompts[::8].tolist(), np.log(s.trajectories[::8]).tolist()):
            by_prompt.setdefault(prompt, []).append(length)
    first, second = zip(*[(v[0], v[1]) for v in by_prompt.values()])
    assert np.corrcoef(first, second)[0, 1] == pytest.approx(0.4, abs=0.12)  # 128 prompts: r's error ~0.08


@pytest.mark.parametrize(
    ("prompts", "field"),
    [
        (dict(group_size=8, dataset=128, group_correlation=0.2, epoch_correlation=0.5), "epoch_correlation"),
        (dict(group_size=7, dataset=128), "group_size"),
        (dict(group_size=8, dataset=10), "dataset"),
    ],
)
def test_a_bad_prompts_block_names_its_field(prompts, field):
    raw = _trace({**_generate(), "prompts": prompts})
    with pytest.raises(TraceError, match=field) as err:
        parse_trace(raw)
    assert "\n" not in str(err.value)


def test_explicit_prompt_ids_need_one_per_trajectory():
    raw = _trace(None, steps=[dict(trajectories=[10.0, 20.0, 30.0], prompts=[0, 1])])
    with pytest.raises(TraceError, match="prompts: give one prompt id per trajectory"):
        parse_trace(raw)
    raw["pipelines"][0]["steps"][0]["prompts"] = [0, 1, 1]
    assert parse_trace(raw).streams["job"][0][1][0].prompts.tolist() == [0, 1, 1]


def _trace(generate: dict | None, steps: list | None = None) -> dict:
    job = dict(id="job", kind="full_finetune", roles=dict(actor_train=dict(gpus=[0, 1]), actor_infer=dict(gpus=[0, 1, 2, 3])))
    job.update(generate=generate) if generate is not None else job.update(steps=steps)
    return dict(format="rlix-trace", version=1, cluster=dict(nodes=1, gpus_per_node=4), pipelines=[job])


# ------------------------------------------------------------------ the predictor and its queue


class _Traj:
    """A trajectory as the queue sees one."""

    def __init__(self, group: Group, idx: int) -> None:
        self.group, self.idx, self.predicted, self.served, self.queued = group, idx, math.nan, NOT_STARTED, False


def _batch(prompts: list[int], start: int = 0) -> list[_Traj]:
    groups: dict[int, Group] = {}
    out = []
    for i, p in enumerate(prompts, start):
        g = groups.setdefault(p, Group(0, 0, p, i))
        out.append(_Traj(g, i))
    return out


def _trusted(predictor: LengthPredictor) -> None:
    """Feed it pairs whose evidence tracks the length, as a job with repeating lengths would."""
    for i in range(MIN_PAIRS):
        g = Group(9, 0, 1000 + i, 0)
        predictor.finished(g, 10.0 + i, math.nan)
        predictor.finished(g, 11.0 + i, math.nan)
        predictor.complete(g)


def _serve(q: PredictedQueue, n: int) -> list[int]:
    return [q.popleft().idx for _ in range(n)]


def test_untrusted_the_queue_serves_the_drawn_order_with_aborted_ones_first():
    q = PredictedQueue(LengthPredictor())
    trajs = _batch([0, 0, 1, 1, 2, 2])
    q.extend(trajs)
    assert _serve(q, 2) == [0, 1]
    q.put_back([trajs[0]])  # taken off its worker
    assert _serve(q, 4) == [0, 2, 3, 4] and len(q) == 1


def test_trusted_it_probes_each_group_then_starts_the_predicted_longest_first():
    predictor = LengthPredictor()
    _trusted(predictor)
    assert predictor.trusted
    q = PredictedQueue(predictor)
    trajs = _batch([0, 0, 0, 1, 1, 1, 2, 2, 2])
    q.extend(trajs)
    assert _serve(q, 3) == [0, 3, 6]  # one probe per group, drawn order
    q.finished(trajs[0], 5.0)  # group 0 is short
    q.finished(trajs[6], 50.0)  # group 2 is long; group 1's probe still runs
    assert _serve(q, 2) == [4, 5]  # a group whose probe still runs is longer than any that finished
    assert _serve(q, 4) == [7, 8, 1, 2] and not q


def test_taken_off_trajectories_go_first_in_the_order_they_last_started_not_as_drawn():
    q, second = _second_epoch(ordered=True)
    started = [q.popleft() for _ in range(3)]
    assert [t.idx for t in started] == [4, 5, 2]  # predicted-longest first: prompt 0's group, then prompt 1's
    q.put_back([started[2], started[0]])  # as they come back: the executor's, one by one in any order
    q.put_back([started[1]])
    assert _serve(q, 4) == [4, 5, 2, 3] and not q  # as they started, then the queue's own order


def _second_epoch(*, ordered: bool) -> tuple[PredictedQueue, list[_Traj]]:
    """A trusted queue that ran prompts 0 (100 s) and 1 (3 s) once, with their second epoch queued."""
    predictor = LengthPredictor()
    _trusted(predictor)
    q = PredictedQueue(predictor, ordered=ordered)
    first = _batch([0, 1])
    q.extend(first)
    for t, seconds in zip(_serve(q, 2), (100.0, 3.0)):
        q.finished(first[t], seconds)
    # Each group of one is whole once it finished: its length is its prompt's history now.
    second = _batch([1, 1, 0, 0], start=2)
    q.extend(second)
    return q, second


def test_a_prompts_earlier_lengths_order_its_next_step_from_the_start():
    q, second = _second_epoch(ordered=True)
    assert _serve(q, 4) == [4, 5, 2, 3]  # prompt 0 was long last epoch
    assert second[2].predicted == pytest.approx(math.log(100.0))


def test_a_queue_told_drawn_keeps_the_drawn_order_though_trusted_and_still_scores_its_predictions():
    q, second = _second_epoch(ordered=False)
    assert _serve(q, 2) == [2, 3]  # ordered, prompt 0 would go first (the test above)
    q.put_back([second[0]])  # taken off its worker: still first to go
    assert _serve(q, 3) == [2, 4, 5] and not q
    assert second[2].predicted == pytest.approx(math.log(100.0))  # what it would have been given
    for t, seconds in ((second[1], 3.5), (second[2], 90.0), (second[3], 110.0), (second[0], 2.5)):
        q.finished(t, seconds)
    assert q.predictor.rank_correlation() > 0.8  # scored as if it had ordered them (ties within a group keep it below 1)


def test_an_untrusted_queue_files_nothing_then_orders_what_waits_once_trusted():
    """Until its predictor is trusted a queue keeps no heap entry or probe line (they would grow with
    every finish of a job that is never trusted); the moment it is, the groups already waiting are ordered."""
    q = PredictedQueue(LengthPredictor())
    for step in range(50):
        trajs = _batch([0, 0, 1, 1], start=4 * step)  # prompt 0 runs 100 s, prompt 1 runs 3 s, every epoch
        q.extend(trajs)
        assert _serve(q, 4) == [t.idx for t in trajs]  # as drawn
        for t in trajs:
            q.finished(t, 100.0 if t.group.prompt == 0 else 3.0)
        assert not q.predictor.trusted and not q._heap and not q._probe and not q._waiting
    waiting = _batch([1, 1, 0, 0], start=200)
    q.extend(waiting)  # filed by nothing yet
    _trusted(q.predictor)
    assert _serve(q, 4) == [202, 203, 200, 201]  # prompt 0 ran long every epoch: it goes first


def test_a_queue_whose_predictor_loses_trust_serves_as_drawn_and_orders_again_when_it_is_back():
    q, second = _second_epoch(ordered=True)  # prompt 0 ran 100 s, prompt 1 3 s: ordered, 4 and 5 go first
    q.predictor.trusted = False  # its evidence stopped tracking lengths
    assert _serve(q, 1) == [2] and not q._heap  # as drawn, and the heap dropped
    q.predictor.trusted = True
    assert _serve(q, 3) == [4, 5, 3]  # the waiting groups filed again by their predictions: prompt 0 first


def test_the_pooled_correlation_centres_each_cohort_on_its_own_means():
    rng = np.random.default_rng(2)
    pooled, xs, ys = Pearson(), [], []
    for step in range(30):  # each step's lengths shifted by the step: a pooled, uncentred r would see that shift
        x = rng.normal(step, 1.0, 16)
        y = 0.5 * x + rng.normal(2 * step, 1.0, 16)
        for a, b in zip(x, y):
            pooled.add((0, step), float(a), float(b))
        xs.append(x - x.mean())
        ys.append(y - y.mean())
    assert pooled.r() == pytest.approx(np.corrcoef(np.concatenate(xs), np.concatenate(ys))[0, 1], rel=1e-9)


def test_evidence_that_does_not_track_lengths_is_never_trusted():
    predictor, rng = LengthPredictor(), np.random.default_rng(0)
    for i in range(5 * MIN_PAIRS):
        g = Group(0, 0, i, 0)
        for seconds in sorted(rng.lognormal(3.0, 1.0, 2)):  # in the order they would finish
            predictor.finished(g, float(seconds), math.nan)
        predictor.complete(g)
    assert predictor.check.n == 10 * MIN_PAIRS and not predictor.trusted


def test_streams_of_unlike_lengths_do_not_make_unrelated_prompts_look_predictive():
    # Two adapters, one's answers e (2.7) times the other's: pooled, a member's siblings would "predict" it.
    predictor, rng = LengthPredictor(), np.random.default_rng(1)
    for i in range(2 * MIN_PAIRS):
        stream = i % 2
        g = Group(stream, 0, i, 0)
        for seconds in sorted(rng.lognormal(3.0 + stream, 0.5, 4)):
            predictor.finished(g, float(seconds), math.nan)
        predictor.complete(g)
    assert not predictor.trusted


# ------------------------------------------------------------------ in a replay


def _replay_trace(correlation: float, prompts: bool = True) -> dict:
    gen = dict(steps=3, trajectories_per_step=512, duration=dict(median_s=20, p99_s=200, max_s=400), seed=3)
    if prompts:
        gen["prompts"] = dict(group_size=8, dataset=128, group_correlation=correlation, epoch_correlation=correlation)
    raw = _trace(gen)
    raw["pipelines"][0].update(slots_per_worker=8)
    raw["pipelines"][0]["generate"]["stages"] = {"actor_train": 30.0}
    return raw


def test_predicted_lengths_shorten_a_replay_and_report_their_rank_correlation():
    drawn = replay(parse_trace(_replay_trace(0.9, prompts=False)), "rlix")
    predicted = replay(parse_trace(_replay_trace(0.9)), "rlix")
    assert drawn.pipelines["job"].length_rank_correlation is None
    assert predicted.pipelines["job"].length_rank_correlation > 0.6
    assert predicted.makespan_s < 0.97 * drawn.makespan_s


def test_uncorrelated_prompts_replay_exactly_as_drawn():
    drawn = replay(parse_trace(_replay_trace(0.0, prompts=False)), "rlix")
    uncorrelated = replay(parse_trace(_replay_trace(0.0)), "rlix")
    assert uncorrelated.makespan_s == drawn.makespan_s
    assert uncorrelated.pipelines["job"].step_latency_p99_s == drawn.pipelines["job"].step_latency_p99_s


def test_a_job_whose_trace_says_drawn_starts_as_drawn_though_it_has_prompt_ids():
    raw = _replay_trace(0.9)
    raw["pipelines"][0]["dispatch"] = "drawn"
    said = replay(parse_trace(raw), "rlix")
    stripped = parse_trace(_replay_trace(0.9))
    for _, steps in stripped.streams["job"]:
        for step in steps:
            step.prompts = None
    assert said.pipelines["job"].length_rank_correlation is None
    assert said.makespan_s == replay(stripped, "rlix").makespan_s
