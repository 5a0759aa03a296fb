"""The YAML schema: loading, line numbers, overrides, dumping, the builder."""

import re

import pytest

import omnigraph as og
from omnigraph.errors import GraphError
from omnigraph.graph.spec import EdgeSpec, GraphSpec
from omnigraph.graph.yamlio import apply_override, dump, load_file, load_text

from conftest import GRAPHS

DESIGN_EXAMPLE = """\
name: grpo-one-step-off
model: {path: tiny, dtype: float32}      # "tiny" = embedded default model
task: {name: digits, prompts: 16, samples_per_prompt: 8}
pools:
  rollout: {actors: 1, cpus: 1, gpus: 0}
  trainer: {actors: 1, cpus: 1, gpus: 0}
nodes:
  generate:    {kind: generate, pool: rollout, backend: hf, max_new_tokens: 16}
  reward:      {kind: reward, pool: rollout, fn: nodes.rewards.rules:digits_match}
  old_logprob: {kind: old_logprob, pool: trainer}
  update:      {kind: update, pool: trainer, lr: 1.0e-3, clip: 0.2}
  sync:        {kind: sync, pool: trainer, payload: full}
edges:
  - generate -> reward
  - reward -> old_logprob: {delay: 1}
  - old_logprob -> update
  - update -> sync
  - sync -> generate: {delay: 1}
schedule: {mode: one_step_off, max_staleness: 1, sync_every: 1, iterations: 60}
"""


class TestLoading:
    def test_design_example_compiles_verbatim_with_bound_1(self):
        plan = og.compile(load_text(DESIGN_EXAMPLE))
        assert plan.bound == 1

    def test_edge_forms_parse(self):
        spec = load_text("edges: ['a -> b', 'a.x -> b.y', {'c -> d': {delay: 2, transport: shm}}]")
        assert spec.edges[0] == EdgeSpec(src="a", dst="b")
        assert (spec.edges[1].src_port, spec.edges[1].dst_port) == ("x", "y")
        assert (spec.edges[2].delay, spec.edges[2].transport) == (2, "shm")

    def test_malformed_edge_names_the_field(self):
        with pytest.raises(GraphError, match=r"edges\.0: edge 'a => b' is not of the form"):
            load_text("edges: ['a => b']")

    def test_syntax_error_reports_the_line(self):
        with pytest.raises(GraphError, match=r"g\.yaml:4: invalid YAML: .*\(while parsing a flow mapping started on line 3\)"):
            load_text("name: x\npools:\n  a: {cpus: 1\n  b: 2\n", "g.yaml")

    def test_schema_error_reports_the_line_of_the_field(self):
        text = "name: x\nschedule:\n  mode: one_step_off\n  iterations: -3\n"
        with pytest.raises(GraphError, match=r"g\.yaml:4: schedule\.iterations: Input should be greater than or equal to 1"):
            load_text(text, "g.yaml")

    def test_unknown_field_gets_the_closest_one_or_says_remove_or_correct(self):
        with pytest.raises(GraphError, match=r"schedule\.sync_evry: unknown field 'sync_evry' \(did you mean "
                                             r"'sync_every'\?\) \(fix: use 'sync_every'\)"):
            load_text("schedule: {sync_evry: 2}")
        with pytest.raises(GraphError, match=r"schedule\.zzz: unknown field 'zzz' \(fix: remove 'zzz' or correct"):
            load_text("schedule: {zzz: 2}")

    def test_python_tags_are_refused(self):
        with pytest.raises(GraphError, match="invalid YAML"):
            load_text("name: !!python/object/apply:os.system ['true']")

    def test_top_level_must_be_a_mapping(self):
        with pytest.raises(GraphError, match="must be a mapping"):
            load_text("- a\n- b\n")

    def test_missing_file(self):
        with pytest.raises(GraphError, match="no such file"):
            load_file("graphs/nope.yaml")

    def test_ahead_only_for_async(self):
        with pytest.raises(GraphError, match="schedule.ahead applies to mode 'async' only"):
            load_text("schedule: {mode: sync, ahead: 2}")


class TestOverrides:
    def test_override_sets_nested_values_parsed_as_yaml(self):
        spec = load_file(GRAPHS / "grpo_one_step_off.yaml",
                         ["schedule.iterations=7", "nodes.update.lr=3e-4", "pools.rollout.actors=2", "name=x"])
        assert spec.schedule.iterations == 7
        assert spec.nodes["update"].lr == 3e-4
        assert spec.pools["rollout"].actors == 2 and spec.name == "x"

    def test_override_is_applied_before_validation(self):
        with pytest.raises(GraphError, match=r"schedule\.mode: Input should be"):
            load_file(GRAPHS / "grpo_one_step_off.yaml", ["schedule.mode=sometimes"])

    def test_override_into_a_list(self):
        raw = apply_override({"edges": ["a -> b"]}, "edges.0=c -> d")
        assert raw == {"edges": ["c -> d"]}

    @pytest.mark.parametrize("bad", ["noequals", "=3", "a..b=1", "edges.9=x"])
    def test_bad_overrides_are_graph_errors(self, bad):
        with pytest.raises(GraphError):
            apply_override({"edges": []}, bad)


class TestDumpAndBuilder:
    @pytest.mark.parametrize("name", ["grpo_sync", "grpo_one_step_off", "grpo_async", "synthetic_one_step_off"])
    def test_yaml_to_builder_to_yaml_is_identity(self, name):
        spec = load_file(GRAPHS / f"{name}.yaml")
        again = og.Graph.from_spec(spec).to_spec()
        assert again == spec
        assert load_text(dump(again)) == spec

    def test_builder_matches_the_yaml(self):
        g = og.Graph("synthetic-one-step-off")
        g.task(name="digits", prompts=8, samples_per_prompt=4)
        g.pool("rollout", actors=1, cpus=1)
        g.pool("trainer", actors=1, cpus=1)
        gen = g.node("generate", kind="generate", pool="rollout", backend="synthetic", cost=0.2)
        rew = g.node("reward", kind="reward", pool="rollout", cost=0.02)
        olp = g.node("old_logprob", kind="old_logprob", pool="trainer", backend="synthetic", cost=0.04)
        upd = g.node("update", kind="update", pool="trainer", backend="synthetic", cost=0.14)
        syn = g.node("sync", kind="sync", pool="trainer", backend="synthetic", cost=0.01)
        g.chain(gen, rew, olp, upd, syn, gen)
        g.schedule(mode="one_step_off", max_staleness=1, iterations=30)
        assert g.to_spec() == load_file(GRAPHS / "synthetic_one_step_off.yaml")

    def test_builder_ports_and_delays(self):
        g = og.Graph("x")
        a = g.node("a", kind="generate", pool="p")
        b = g.node("b", kind="reward", pool="p")
        g.edge(a["rollout"], b["rollout"], delay=2)
        assert g.to_spec().edges[0] == EdgeSpec(src="a", src_port="rollout", dst="b", dst_port="rollout", delay=2)

    def test_builder_duplicate_node_is_an_error(self):
        g = og.Graph("x")
        g.node("a", kind="generate", pool="p")
        with pytest.raises(GraphError, match="node 'a' is defined twice"):
            g.node("a", kind="reward", pool="p")

    def test_dump_writes_kind_and_pool_of_every_node(self):
        text = dump(load_file(GRAPHS / "grpo_one_step_off.yaml"))
        assert re.search(r"generate:\n\s+kind: generate\n\s+pool: rollout", text)

    def test_spec_rejects_non_spec_sources(self):
        with pytest.raises(GraphError, match="cannot compile a int"):
            og.compile(3)

    def test_default_spec_is_valid_schema(self):
        assert GraphSpec().schedule.mode == "one_step_off"


class TestOverrideMistakes:
    def test_a_misspelt_node_or_pool_in_an_override_gets_the_closest_name_and_cites_the_command_line(self):
        with pytest.raises(GraphError) as e:
            og.compile(GRAPHS / "grpo_one_step_off.yaml", overrides=["nodes.generat.max_new_tokens=4"])
        assert str(e.value).startswith("override 'nodes.generat.max_new_tokens=4': nodes.generat: no node 'generat' "
                                       "(did you mean 'generate'?)")
        assert e.value.fix == "use 'nodes.generate.max_new_tokens=4'"
        with pytest.raises(GraphError, match=r"no pool 'rolout' \(did you mean 'rollout'\?\)"):
            og.compile(GRAPHS / "grpo_one_step_off.yaml", overrides=["pools.rolout.cpus=1"])

    def test_a_bad_value_from_the_command_line_cites_the_override_not_a_line_of_the_file(self):
        with pytest.raises(GraphError) as e:
            og.compile(GRAPHS / "grpo_one_step_off.yaml", overrides=["nodes.update.lr=-1"])
        assert str(e.value).startswith("override 'nodes.update.lr=-1': nodes.update.lr: Input should be greater than 0")
        with pytest.raises(GraphError) as e:                 # the same value in the file cites its line
            og.load_text("name: x\nnodes:\n  update: {kind: update, pool: trainer, lr: -1}\n", "g.yaml")
        assert str(e.value).startswith("g.yaml:3: nodes.update.lr")
