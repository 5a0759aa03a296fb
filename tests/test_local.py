"""The local executor: the reference semantics of a plan."""

import json

import pytest

import omnigraph as og
from omnigraph.errors import GraphError, NodeFailure, StalenessError
from omnigraph.executors import make_executor
from omnigraph.runtime import run
from omnigraph.testing import canonical_spec


def records(plan, node):
    ex = make_executor(plan, "local")
    ex.start()
    out = [r for step in ex.steps() for r in step.records if r["node"] == node]
    ex.stop()
    return out


class TestRuns:
    @pytest.mark.parametrize("mode,kw", [("sync", {}), ("one_step_off", {}), ("async", {"ahead": 2}),
                                         ("one_step_off", {"sync_every": 3})])
    def test_every_group_is_trained_exactly_once(self, mode, kw, tmp_runs):
        plan = og.compile(canonical_spec(mode, iterations=9, **kw))
        s = run(plan, run_dir=tmp_runs, executor="local", progress=False).summary
        assert s["groups_generated"] == 9 * 16 == s["groups_trained"]
        assert s["groups_lost"] == s["groups_trained_twice"] == 0
        assert s["observed_max_staleness"] == plan.bound

    def test_run_directory_holds_config_plan_and_metrics(self, tmp_runs):
        plan = og.compile(canonical_spec("one_step_off", iterations=4))
        result = run(plan, run_dir=tmp_runs, executor="local", progress=False)
        names = sorted(p.name for p in result.run_dir.iterdir())
        assert {"config.yaml", "metrics.jsonl", "plan.txt", "summary.json", "timeline.jsonl"} <= set(names)
        rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == list(range(5))
        assert rows[0]["fired"] == ["generate", "reward"]
        assert "timing_s/update" in rows[1] and rows[1]["staleness_max"] == 0

    def test_two_runs_never_share_a_directory(self, tmp_runs):
        plan = og.compile(canonical_spec("sync", iterations=1))
        a = run(plan, run_dir=tmp_runs, executor="local", progress=False).run_dir
        b = run(plan, run_dir=tmp_runs, executor="local", progress=False).run_dir
        assert a != b

    def test_data_parallel_pools_train_every_group_once(self, tmp_runs):
        plan = og.compile(canonical_spec("one_step_off", iterations=5),
                          overrides=["pools.rollout.actors=2", "pools.trainer.actors=4"])
        s = run(plan, run_dir=tmp_runs, executor="local", progress=False).summary
        assert s["groups_trained"] == s["groups_generated"] == 80 and s["groups_trained_twice"] == 0

    def test_outputs_are_deterministic(self):
        plan = og.compile(canonical_spec("one_step_off", iterations=6))
        a = [r["reward_mean"] for r in records(plan, "reward")]
        b = [r["reward_mean"] for r in records(plan, "reward")]
        assert a == b and len(a) == 6


class TestStalePolicy:
    """max_staleness below the bound: on_stale decides (error is refused at compile time)."""

    def spec(self, policy):
        return canonical_spec("one_step_off", sync_every=3, max_staleness=1, iterations=12, on_stale=policy)

    def test_drop_removes_the_stale_samples_and_counts_them(self, tmp_runs):
        plan = og.compile(self.spec("drop"))
        assert plan.bound == 3
        s = run(plan, run_dir=tmp_runs, executor="local", progress=False).summary
        assert s["dropped_samples"] > 0 and s["groups_lost"] == 0 and s["groups_trained_twice"] == 0
        assert all(r["staleness_max"] <= 1 for r in records(plan, "update") if r["samples"] > r["dropped"])

    def test_wait_regenerates_with_fresh_weights(self):
        plan = og.compile(self.spec("wait"))
        ups = records(plan, "update")
        assert any(r.get("regenerated") for r in ups)
        assert max(r["staleness_max"] for r in ups) <= 1

    def test_error_policy_stops_at_runtime_if_a_node_lies_about_versions(self, monkeypatch):
        import nodes.synthetic as syn
        real = syn.Generate.generate

        def stale(self, step, prompts, weights):
            out = real(self, step, prompts, weights)
            out.min_version = [-5] * len(out)
            return out

        monkeypatch.setattr(syn.Generate, "generate", stale)
        plan = og.compile(canonical_spec("one_step_off", iterations=3))
        with pytest.raises(StalenessError, match=r"staleness \d+ > bound 1"):
            records(plan, "update")


class TestFailures:
    def test_node_error_names_node_and_iteration(self, monkeypatch):
        import nodes.synthetic as syn

        def boom(self, step, batch):
            if step == 2:
                raise ValueError("bad batch")

        monkeypatch.setattr(syn.Update, "train", boom)
        plan = og.compile(canonical_spec("one_step_off", iterations=4))
        with pytest.raises(NodeFailure, match=r"node update failed at iteration 2: ValueError: bad batch"):
            records(plan, "update")

    def test_a_reward_returning_nan_is_never_trained_on_and_stops_the_run_after_three_steps(self, tmp_path,
                                                                                            monkeypatch):
        (tmp_path / "nanreward.py").write_text("def r(prompt, completion, **meta):\n    return float('nan')\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        plan = og.compile(canonical_spec("sync", iterations=5), overrides=["nodes.reward.backend=python",
                                                                            "nodes.reward.fn=nanreward:r"])
        assert {r["nonfinite_rewards"] for r in records(plan, "reward")} == {16 * 8}
        updates = records(plan, "update")
        assert [r["nonfinite_in_a_row"] for r in updates] == [1, 2, 3, 4, 5] and not any("loss" in r for r in updates)
        with pytest.raises(GraphError, match=r"runtime.max_nonfinite_steps: 3 steps in a row up to step 2"):
            run(plan, run_dir=tmp_path / "runs", progress=False)


class TestLedger:
    def test_ledger_accounts_for_every_group(self, tmp_runs, capsys):
        from omnigraph.cli import main
        plan = og.compile(canonical_spec("one_step_off", sync_every=3, max_staleness=1, iterations=12,
                                         on_stale="drop"))
        d = run(plan, run_dir=tmp_runs, executor="local", progress=False).run_dir
        assert main(["ledger", str(d), "--json"]) == 0
        s = json.loads(capsys.readouterr().out)
        assert s["ok"] and s["generated"] == 12 * 16 and s["lost"] == 0 and s["trained_twice"] == []
        assert s["dropped"]["stale"] > 0
        assert s["trained_once"] + s["dropped"]["stale"] == s["generated"]
        assert set(int(k) for k in s["staleness"]) <= {0, 1}

    def test_ledger_of_a_missing_run_is_a_clear_error(self, tmp_path, capsys):
        from omnigraph.cli import main
        assert main(["ledger", str(tmp_path)]) == 1
        assert "no ledger in" in capsys.readouterr().err
