"""The static staleness proof, case by case (the bounds docs/concepts.md and docs/guides/schedules.md state)."""

import pytest

import omnigraph as og
from omnigraph.errors import GraphError
from omnigraph.proof.schedule import DelayLine, Firing
from omnigraph.proof.staleness import analyse, horizon
from omnigraph.testing import canonical_graph, canonical_spec

CASES = [
    ("sync", {}, 0),
    ("sync", {"sync_every": 2}, 1),
    ("one_step_off", {}, 1),
    ("one_step_off", {"sync_every": 4}, 4),
    ("async", {"ahead": 1}, 1),
    ("async", {"ahead": 2}, 2),
    ("async", {"ahead": 3}, 3),
    ("async", {"ahead": 2, "sync_every": 3}, 4),
]


@pytest.mark.parametrize("mode,kw,bound", CASES, ids=[f"{m}-{kw}" for m, kw, _ in CASES])
def test_bound_is_exact(mode, kw, bound):
    assert analyse(canonical_graph(mode, iterations=60, **kw)).bound == bound


@pytest.mark.parametrize("mode,kw,bound", CASES, ids=[f"{m}-{kw}" for m, kw, _ in CASES])
def test_bound_matches_the_closed_form_for_the_canonical_chain(mode, kw, bound):
    """data delay + weight delay - 1 + (sync_every - 1)."""
    g = canonical_graph(mode, iterations=60, **kw)
    data = sum(e.delay for e in g.edges if not e.state)
    weight = sum(e.delay for e in g.edges if e.state)
    assert data + weight - 1 + (kw.get("sync_every", 1) - 1) == bound


def test_short_runs_see_less_than_the_steady_state():
    assert analyse(canonical_graph("one_step_off", sync_every=4, iterations=3)).bound == 2


def test_long_runs_unroll_only_the_horizon():
    g = canonical_graph("one_step_off", sync_every=4, iterations=5_000_000)
    report = analyse(g)
    assert report.iterations_unrolled == horizon(g) < 100
    assert report.bound == 4


def test_every_batch_is_trained_once_with_its_staleness():
    report = analyse(canonical_graph("async", ahead=2, iterations=10))
    assert [t.batch for t in report.trained] == list(range(10))
    assert [t.staleness for t in report.trained] == [0, 1, 2, 2, 2, 2, 2, 2, 2, 2]


def test_too_stale_is_an_error_unless_the_policy_allows_it():
    with pytest.raises(GraphError, match=r"schedule\.max_staleness: .* 4 versions stale"):
        og.compile(canonical_spec("one_step_off", sync_every=4, max_staleness=1))
    plan = og.compile(canonical_spec("one_step_off", sync_every=4, max_staleness=1, on_stale="drop"))
    assert plan.bound == 4 and any("on_stale drop will drop" in w for w in plan.warnings)


def test_firing_fill_and_drain():
    f = Firing(canonical_graph("async", ahead=2), iterations=3)
    fired = [sorted(f.next()) for _ in range(f.steps)]
    assert f.fill == 2 and len(fired) == 5
    assert fired[0] == fired[1] == ["generate", "reward"]
    assert fired[-1] == ["old_logprob", "sync", "update"]


class TestDelayLine:
    def test_stream_is_fifo_by_step(self):
        line = DelayLine(2, state=False)
        line.push(0, "a")
        line.push(1, "b")
        assert line.read(2) == "a" and line.read(3) == "b"

    def test_stream_out_of_step_is_loud(self):
        line = DelayLine(1, state=False)
        line.push(0, "a")
        with pytest.raises(RuntimeError, match="out of step"):
            line.read(3)

    def test_state_holds_the_newest_due_value(self):
        line = DelayLine(1, state=True, initial="w0")
        assert line.read(0) == "w0"
        line.push(0, "w1")
        line.push(1, "w2")
        assert line.read(1) == "w1" and line.read(1) == "w1" and line.read(5) == "w2"
