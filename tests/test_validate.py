"""Invariants: every fixture under tests/graphs/ validates, or fails with the message users read."""

import re

import pytest

import omnigraph as og
from omnigraph.errors import GraphError
from omnigraph.testing import canonical_spec

from conftest import FIXTURES, GRAPHS, expectations

INVALID = sorted((FIXTURES / "invalid").glob("*.yaml"))
VALID = sorted((FIXTURES / "valid").glob("*.yaml"))
CLUSTER = {"cpus": 2, "gpus": 0}


class TestInvalidGraphs:
    @pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
    def test_fixture_fails_with_its_message(self, path):
        (expected,) = expectations(path, "expect")
        with pytest.raises(GraphError) as info:
            og.compile(path, cluster=CLUSTER)
        assert re.search(expected, str(info.value)), str(info.value)

    def test_every_error_has_a_fix(self):
        for path in INVALID:
            with pytest.raises(GraphError) as info:
                og.compile(path, cluster=CLUSTER)
            assert "(fix: " in str(info.value), path.name

    def test_two_update_nodes_are_rejected(self):
        spec = canonical_spec().model_dump(mode="json")
        spec["nodes"]["update2"] = {"kind": "update", "pool": "trainer", "backend": "synthetic"}
        with pytest.raises(GraphError, match="exactly one update node, found 2"):
            og.compile(og.GraphSpec.model_validate(spec))

    def test_old_logprob_must_share_the_update_pool(self):
        with pytest.raises(GraphError, match=r"nodes\.old_logprob\.pool: .*set pool: trainer"):
            og.compile(canonical_spec(), overrides=["nodes.old_logprob.pool=rollout"])

    def test_rate_on_a_stream_consumer_is_rejected(self):
        spec = canonical_spec().model_dump(mode="json")
        spec["nodes"]["log"] = {"kind": "custom", "pool": "trainer", "cls": "nodes.synthetic:SyntheticNode",
                                "inputs": {"batch": "Batch"}, "every": 2}
        spec["edges"].append("reward -> log")
        with pytest.raises(GraphError, match=r"nodes\.log\.every: .*batches would be lost"):
            og.compile(og.GraphSpec.model_validate(spec))

    def test_mini_batch_must_divide_the_batch(self):
        with pytest.raises(GraphError, match=r"nodes\.update\.mini_batch_size: mini_batch_size 5 does not divide"):
            og.compile(canonical_spec(), overrides=["nodes.update.mini_batch_size=5"])

    def test_fractional_gpus_above_one(self):
        with pytest.raises(GraphError, match=r"pools\.trainer\.gpus: 1.5 GPUs per actor"):
            og.compile(canonical_spec(), overrides=["pools.trainer.gpus=1.5"])


class TestValidGraphs:
    @pytest.mark.parametrize("path", VALID, ids=lambda p: p.stem)
    def test_fixture_compiles_with_its_bound(self, path):
        plan = og.compile(path)
        (bound,) = expectations(path, "expect-bound")
        assert plan.bound == int(bound)
        for warning in expectations(path, "expect-warning"):
            assert any(warning in w for w in plan.warnings), plan.warnings

    @pytest.mark.parametrize("name,bound", [("grpo_sync", 0), ("grpo_one_step_off", 1), ("grpo_async", 2),
                                            ("synthetic_one_step_off", 1)])
    def test_shipped_graphs(self, name, bound):
        assert og.compile(GRAPHS / f"{name}.yaml", cluster=CLUSTER).bound == bound

    def test_mode_sugar_puts_the_delay_where_trainer_work_begins(self):
        plan = og.compile(GRAPHS / "grpo_one_step_off.yaml")
        delays = {(e.src, e.dst): e.delay for e in plan.graph.edges}
        assert delays == {("generate", "reward"): 0, ("reward", "old_logprob"): 1, ("old_logprob", "update"): 0,
                          ("update", "sync"): 0, ("sync", "generate"): 1}

    def test_the_delay_follows_roles_not_pools(self):
        """Where rollout work ends follows from the nodes' roles: moving reward (or every node) onto the
        trainer's pool keeps the delay on reward -> old_logprob and the bound, and says one pool cannot overlap."""
        for overrides in (["nodes.reward.pool=trainer"],
                          [f"nodes.{n}.pool=trainer" for n in ("generate", "reward")]):
            plan = og.compile(canonical_spec(), overrides=overrides)
            assert [(e.src, e.dst) for e in plan.graph.edges if e.delay and not e.state] == [("reward", "old_logprob")]
            assert plan.bound == 1
        assert any("no overlap" in w for w in plan.warnings)

    def test_the_shipped_graph_runs_colocated_by_changing_pools_only(self):
        """graphs/grpo_one_step_off.yaml with every node on one pool: valid, same bound, a warning."""
        over = [f"nodes.{n}.pool=trainer" for n in ("generate", "reward", "old_logprob", "update", "sync")]
        plan = og.compile(GRAPHS / "grpo_one_step_off.yaml", overrides=over)
        assert plan.bound == og.compile(GRAPHS / "grpo_one_step_off.yaml").bound == 1
        assert list(plan.actors) == ["trainer.0"] and any("no overlap" in w for w in plan.warnings)

    def test_colocation_is_allowed_but_reported(self):
        plan = og.compile(canonical_spec(colocate=True))
        assert any("no overlap" in w for w in plan.warnings)


def test_float16_training_is_refused_with_the_fix():
    """A float16 trainer without a gradient scaler would underflow small gradients to zero: refused."""
    with pytest.raises(GraphError) as e:
        og.compile(GRAPHS / "grpo_one_step_off.yaml", overrides=["model.dtype=float16"])
    assert e.value.where == "model.dtype" and "gradient scaler" in str(e.value) and "bfloat16" in e.value.fix
    og.compile(GRAPHS / "grpo_one_step_off.yaml", overrides=["nodes.generate.dtype=float16"])   # rollouts alone: fine


SPLIT = ["pools.rollout={actors: 1, cpus: 1, gpus: 0}", "nodes.generate.pool=rollout", "nodes.reward.pool=rollout",
         "pools.trainer.cpus=1"]


def test_a_schedule_that_runs_its_pools_one_at_a_time_is_warned_about():
    """sync on two pools: each pool waits while the other works (predicted step = the sum); the shipped sync graph
    is one pool, and one-step-off on two pools overlaps them: no warning."""
    idle = [w for w in og.compile(GRAPHS / "grpo_sync.yaml", overrides=SPLIT).warnings if w.startswith("idle cores")]
    assert len(idle) == 1 and "rollout (1x1 CPU), trainer (1x1 CPU)" in idle[0] and "all 2 CPUs" in idle[0], idle
    assert "colocate" in idle[0] and "one_step_off" in idle[0]
    for graph in ("grpo_sync.yaml", "grpo_one_step_off.yaml", "grpo_async.yaml"):
        assert not [w for w in og.compile(GRAPHS / graph).warnings if w.startswith("idle cores")], graph
