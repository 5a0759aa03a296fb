"""Fan-out and join: a batch goes to old_logprob (trainer pool) and ref_logprob (a pool of its own), and the
update joins the branches by batch id, fields merged, the proof and the plan covering the join."""

import os

import pytest

import omnigraph as og
from omnigraph.executors import make_executor
from omnigraph.runtime import run
from omnigraph.runtime.ledger import read
from omnigraph.sdk import SampleBatch

from conftest import FIXTURES, GRAPHS

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
FAN_IN = FIXTURES / "valid" / "fan_in.yaml"


def batch(fields, versions=(3, 3)):
    return SampleBatch(7, [70, 70], list(versions), list(versions), fields, {"prompt_len": 4})


class TestJoin:
    def test_branches_of_one_batch_merge_their_fields_and_keep_the_oldest_version(self):
        a = batch({"reward": [1.0, 0.0], "old_logprob": [-1.0, -2.0]}, versions=(3, 2))
        b = batch({"reward": [1.0, 0.0], "ref_logprob": [-1.5, -2.5]})
        j = SampleBatch.join([a, b])
        assert set(j.fields) == {"reward", "old_logprob", "ref_logprob"} and j.fields["ref_logprob"] == [-1.5, -2.5]
        assert j.min_version == [3, 2] and j.max_version == [3, 3] and j.group_ids == [70, 70]

    def test_branches_of_different_batches_do_not_join(self):
        other = SampleBatch(8, [80, 80], [3, 3], [3, 3], {})
        with pytest.raises(ValueError, match="a join needs the same samples on every branch"):
            SampleBatch.join([batch({}), other])

    def test_two_producers_into_one_weights_input_are_refused(self):
        spec = og.load(FAN_IN).model_dump(mode="json")
        spec["edges"].append("update -> generate")
        with pytest.raises(og.GraphError, match="a Weights input holds one value"):
            og.compile(og.GraphSpec.model_validate(spec))


class TestPlan:
    def test_the_join_is_planned_and_printed_with_the_same_bound(self):
        plan = og.compile(FAN_IN)
        into = {(c.src.actor, c.transport) for c in plan.channels if c.edge.dst == "update" and not c.edge.state}
        assert into == {("trainer.0", "local"), ("ref.0", "shm")}
        delayed = sorted((e.src, e.dst) for e in plan.graph.edges if e.delay and not e.state)
        assert delayed == [("reward", "old_logprob"), ("reward", "ref_logprob")] and plan.bound == 1
        assert "join update.batch <- old_logprob, ref_logprob" in str(plan)
        assert [t.label for t in plan.order["ref.0"]] == ["ref_logprob", "stash reward->ref_logprob.batch"]

    def test_executors_agree_on_a_join(self):
        """The same records (versions, rewards) on local and ray."""
        def run_all(name):
            ex = make_executor(og.compile(FAN_IN, overrides=["schedule.iterations=5"]), name)
            ex.start()
            try:
                return sorted((r["node"], r["step"], r.get("staleness_max"), r.get("reward_mean"), r.get("version"))
                              for s in ex.steps() for r in s.records if r.get("kind", "run") == "run")
            finally:
                ex.stop()
        assert run_all("local") == run_all("ray")


@pytest.mark.slow
def test_a_reference_model_on_its_own_pool_trains_with_a_kl_penalty(tmp_path):
    plan = og.compile(GRAPHS / "grpo_ref_fan_in.yaml", overrides=["schedule.iterations=12"])
    res = run(plan, run_dir=tmp_path, progress=False)
    kl = [r["kl"] for r in res.metrics if "kl" in r]
    assert len(kl) == 12 and kl[0] == 0.0 and max(kl) > 0      # the policy leaves the reference, the KL sees it
    ledger = read(res.run_dir)
    assert ledger.ok and ledger.trained_once == 12 * 16 and res.summary["observed_max_staleness"] <= 1
