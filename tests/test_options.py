"""Typed plugin options: every plugin kind declares what its ``options:`` may hold, ``omnigraph check`` validates
it (the field, the closest known key, the fix) and the plugin gets it typed."""

import subprocess
import sys
from pathlib import Path

import pytest

import omnigraph as og
from omnigraph.errors import GraphError
from omnigraph.testing import build_node

from conftest import GRAPHS

EXE = str(Path(sys.executable).with_name("omnigraph"))


@pytest.mark.parametrize("graph, override, where, says", [
    ("grpo_one_step_off.yaml", "nodes.generate.options.decod=eager", "nodes.generate.options.decod",
     "unknown generate backend hf option 'decod' (did you mean 'decode'?"),
    ("smollm2_vllm_one_step_off.yaml", "nodes.generate.options.lora_servng=merged",
     "nodes.generate.options.lora_servng", "unknown generate backend vllm option 'lora_servng' (did you mean "
                                          "'lora_serving'?"),
    ("flowgrpo_sync.yaml", "nodes.update.options.timestep_fractio=0.5", "nodes.update.options.timestep_fractio",
     "unknown update backend flow option 'timestep_fractio' (did you mean 'timestep_fraction'?"),
    ("grpo_one_step_off.yaml", "task.options.max_lne=5", "task.options.max_lne",
     "unknown task digits option 'max_lne' (did you mean 'max_len'?"),
    ("smollm2_reasoning_gym.yaml", "task.options.fewshots=2", "task.options.fewshots",
     "unknown task reasoning_gym option 'fewshots' (did you mean 'fewshot'?"),
    ("smollm2_calculator.yaml", "nodes.generate.env.options.latncy_s=1", "nodes.generate.env.options.latncy_s",
     "unknown environment calculator option 'latncy_s' (did you mean 'latency_s'?"),
    ("grpo_one_step_off.yaml", "runtime.logger_options={wandb: {projet: x}}", "runtime.logger_options.wandb.projet",
     "unknown logger wandb option 'projet' (did you mean 'project'?"),
    ("gpu/grpo_one_step_off_2gpu.yaml", "nodes.sync.transport_options.bucket_m=1", "nodes.sync.transport_options.bucket_m",
     "unknown weights path nccl option 'bucket_m' (did you mean 'bucket_mb'?"),
])
def test_a_misspelt_option_of_every_plugin_kind_is_refused_at_check_with_the_closest_key(graph, override, where,
                                                                                         says):
    extra = ["runtime.loggers=[wandb]"] if "logger_options" in override else []
    with pytest.raises(GraphError) as e:
        og.compile(GRAPHS / graph, overrides=[override, *extra])
    assert e.value.where == where and says in e.value.message, str(e.value)


def test_a_value_out_of_range_names_the_option_and_what_it_means():
    with pytest.raises(GraphError) as e:
        og.compile(GRAPHS / "flowgrpo_sync.yaml", overrides=["nodes.generate.options.steps=0"])
    assert e.value.where == "nodes.generate.options.steps" and "Denoising steps" in e.value.fix


def test_check_says_it_in_one_line_and_exits_1():
    out = subprocess.run([EXE, "check", str(GRAPHS / "grpo_one_step_off.yaml"), "task.options.max_lne=5"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert out.stderr.startswith("error: task.options.max_lne: unknown task digits option")


def test_a_node_gets_its_backends_options_typed():
    from nodes.diffusion import SamplerOptions
    plan = og.compile(GRAPHS / "flowgrpo_sync.yaml", overrides=["nodes.generate.options.steps=6"])
    opts = plan.graph.nodes["generate"].backend_options
    assert isinstance(opts, SamplerOptions) and opts.steps == 6 and opts.noise_level == 0.7
    gen, ctx = build_node(plan.graph.spec, "generate")
    assert ctx.backend_options == opts and gen.steps == 6


def test_a_task_and_an_environment_get_their_options_as_typed_keyword_arguments():
    from omnigraph import plugins
    spec = og.load(GRAPHS / "grpo_one_step_off.yaml", ["task.options={max_len: 6, long_share: 0.5}"])
    task = plugins.make_task(spec)
    assert (task.max_len, task.long_share) == (6, 0.5)
    with pytest.raises(GraphError, match=r"task.options.long_share: Input should be less than or equal to 1"):
        og.compile(GRAPHS / "grpo_one_step_off.yaml", overrides=["task.options.long_share=2"])


def test_options_for_a_logger_not_listed_are_refused():
    with pytest.raises(GraphError) as e:
        og.compile(GRAPHS / "grpo_one_step_off.yaml", overrides=["runtime.logger_options={wandb: {project: x}}"])
    assert e.value.where == "runtime.logger_options.wandb"


def test_a_data_field_a_task_does_not_take_is_named():
    with pytest.raises(GraphError) as e:
        og.compile(GRAPHS / "smollm2_reasoning_gym.yaml", overrides=["task.epochs=2"])
    assert e.value.where == "task.epochs" and "does not apply to task 'reasoning_gym'" in e.value.message


def test_a_backend_option_written_as_a_node_field_says_where_it_belongs():
    with pytest.raises(GraphError) as e:
        og.compile(GRAPHS / "smollm2_vllm_one_step_off.yaml", overrides=["nodes.generate.lora_serving=merged"])
    assert e.value.where == "nodes.generate.lora_serving" and "an option of backend vllm" in e.value.message
    assert "options: {lora_serving: ...}" in e.value.fix


@pytest.mark.parametrize("override, close", [("nodes.update.lrr=1", "lr"), ("pools.rollout.cpu=1", "cpus"),
                                             ("schedule.itertions=3", "iterations")])
def test_a_misspelt_graph_field_gets_the_closest_one(override, close):
    with pytest.raises(GraphError) as e:
        og.compile(GRAPHS / "grpo_one_step_off.yaml", overrides=[override])
    assert f"(did you mean '{close}'?)" in e.value.message and e.value.fix == f"use '{close}'"
