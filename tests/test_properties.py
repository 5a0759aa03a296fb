"""Laws that hold for every graph, checked on random ones (hypothesis)."""

import random

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import omnigraph as og
from omnigraph.errors import GraphError
from omnigraph.executors import make_executor
from omnigraph.graph.yamlio import dump, load_text

from conftest import GRAPHS

POOLS = ["p0", "p1", "p2"]
SETTINGS = settings(deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def graphs(draw):
    """Random valid RL graphs: modes, delays, rates, placements, data parallelism, run lengths."""
    mode = draw(st.sampled_from(["sync", "one_step_off", "async", "custom"]))
    schedule = {"mode": mode, "sync_every": draw(st.integers(1, 4)), "iterations": draw(st.integers(1, 20)),
                "max_staleness": 1000}
    if mode == "async":
        schedule["ahead"] = draw(st.integers(1, 3))
    pools = {p: {"actors": draw(st.sampled_from([1, 2, 4])), "cpus": 1} for p in POOLS}
    pool = lambda: draw(st.sampled_from(POOLS))  # noqa: E731
    update_pool = pool()
    nodes = {
        "generate": {"kind": "generate", "pool": pool(), "backend": "synthetic"},
        "reward": {"kind": "reward", "pool": pool(), "backend": "synthetic"},
        "old_logprob": {"kind": "old_logprob", "pool": update_pool, "backend": "synthetic"},
        "update": {"kind": "update", "pool": update_pool, "backend": "synthetic"},
        "sync": {"kind": "sync", "pool": pool(), "backend": "synthetic"},
    }
    chain = ["generate", "reward", "old_logprob", "update", "sync"]
    if draw(st.booleans()):
        nodes["ref_logprob"] = {"kind": "ref_logprob", "pool": pool(), "backend": "synthetic"}
        chain.insert(2, "ref_logprob")
    edges = []
    for a, b in zip(chain, chain[1:] + ["generate"]):
        if mode == "custom":
            d = draw(st.integers(1, 2)) if b == "generate" else draw(st.integers(0, 2))
            edges.append({f"{a} -> {b}": {"delay": d}})
        else:
            edges.append(f"{a} -> {b}")
    return {"name": "random", "task": {"prompts": 4, "samples_per_prompt": 2}, "pools": pools,
            "nodes": nodes, "edges": edges, "schedule": schedule, "runtime": {"executor": "local"}}


def run_local(plan):
    ex = make_executor(plan, "local")
    ex.start()
    recs = [r for s in ex.steps() for r in s.records]
    ex.stop()
    return recs


@SETTINGS
@given(graphs())
def test_observed_staleness_equals_the_static_bound_and_never_exceeds_it(raw):
    """For random valid graphs on the local executor, the largest observed staleness is the bound."""
    plan = og.compile(og.GraphSpec.model_validate(raw))
    recs = run_local(plan)
    updates = [r for r in recs if r["node"] == "update"]
    assert all(r["staleness_max"] <= plan.bound for r in updates)
    assert max(r["staleness_max"] for r in updates) == plan.bound
    trained = [g for r in updates for g in r["trained_groups"]]
    generated = [g for r in recs for g in r.get("generated_groups", [])]
    assert sorted(trained) == sorted(generated) == list(range(4 * plan.iterations))


@SETTINGS
@given(graphs())
def test_yaml_builder_round_trip_is_the_identity(raw):
    """YAML -> spec -> builder -> spec -> YAML -> spec gives back the same spec."""
    spec = og.GraphSpec.model_validate(raw)
    assert og.Graph.from_spec(spec).to_spec() == spec
    assert load_text(dump(spec)) == spec
    assert og.Graph.from_yaml(og.Graph.from_spec(spec).to_yaml()).to_spec() == spec


@SETTINGS
@given(graphs())
def test_each_actor_order_respects_every_zero_delay_dependency(raw):
    """Per actor: a task comes after every task of the same actor it depends on in the same step;
    the global order is a linear extension of all dependencies (so no two actors wait on each other)."""
    plan = og.compile(og.GraphSpec.model_validate(raw))
    position = {t: i for i, t in enumerate(plan.tasks)}
    for task, deps in plan.deps.items():
        for d in deps:
            assert position[d] < position[task], (d.label, task.label)
    for actor, tasks in plan.order.items():
        assert tasks == [t for t in plan.tasks if t.actor == actor]
        for t in tasks:
            if t.op == "stash":
                run = next(x for x in tasks if x.op == "run" and x.node == t.node)
                assert tasks.index(run) < tasks.index(t), "compute must come before stash"


SOURCES = [(GRAPHS / f).read_text() for f in ("grpo_one_step_off.yaml", "synthetic_one_step_off.yaml", "grpo_async.yaml")]
NASTY = ["-1", "0", "1e309", "99999999999999999999", "null", "[]", "{}", "'\u00e9\u2603'", "!!python/none",
         "&a [*a]", "true", "'a -> a'", "0.5", "'x' * 3", "\t", "{delay: -1}", "[[[[[[]]]]]]"]


@settings(deadline=None, max_examples=300)
@given(st.sampled_from(range(len(SOURCES))), st.randoms(use_true_random=False), st.integers(1, 3))
def test_random_mutations_validate_or_raise_graph_error(source, rnd: random.Random, n):
    """Mutated YAML either compiles or raises GraphError: never any other exception."""
    lines = SOURCES[source].splitlines()
    for _ in range(n):
        i = rnd.randrange(len(lines))
        op = rnd.randrange(5)
        if op == 0:
            del lines[i]
        elif op == 1:
            lines.insert(i, lines[rnd.randrange(len(lines))])
        elif op == 2 and ":" in lines[i]:
            key, _, _ = lines[i].partition(":")
            lines[i] = f"{key}: {rnd.choice(NASTY)}"
        elif op == 3:
            tokens = lines[i].split(" ")
            tokens[rnd.randrange(len(tokens))] = rnd.choice(NASTY)
            lines[i] = " ".join(tokens)
        else:
            j = rnd.randrange(len(lines[i]) + 1)
            lines[i] = lines[i][:j] + rnd.choice(["{", "}", "[", ":", "-", " ", "#", "\"", "é"]) + lines[i][j:]
        if not lines:
            lines = [""]
    text = "\n".join(lines)
    try:
        og.compile(load_text(text, "mutant.yaml"))
    except GraphError:
        pass


def test_mutation_sources_are_valid():
    for text in SOURCES:
        assert isinstance(yaml.safe_load(text), dict)
        og.compile(load_text(text))
