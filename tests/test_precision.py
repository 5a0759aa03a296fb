"""``model.dtype: auto`` (the default): bf16 only where the hardware runs it natively, per pool, printed in the plan."""

import importlib

import pytest

import omnigraph as og
from omnigraph.errors import GraphError
from omnigraph.executors import build
from omnigraph.planning.precision import cpu_flags, resolve
from omnigraph.graph.spec import GraphSpec, ModelSpec
from omnigraph.testing import build_node

from conftest import GRAPHS

lower = importlib.import_module("omnigraph.planning.lower")   # the module (the package exports the function)
ONE_STEP_OFF = GRAPHS / "grpo_one_step_off.yaml"
AMX = {"fpu", "avx2", "avx512f", "avx512bw", "amx_tile", "amx_bf16", "avx512_bf16"}
ICE_LAKE = {"fpu", "avx2", "avx512f", "avx512bw", "avx512_vnni"}


class TestResolver:
    @pytest.mark.parametrize("flags, want, why", [
        (AMX, "bfloat16", "CPU has amx_bf16"),
        ({"avx512f", "avx512_bf16"}, "bfloat16", "CPU has avx512_bf16"),
        (ICE_LAKE, "float32", "CPU without AMX or AVX512-BF16"),
        (set(), "float32", "CPU without AMX or AVX512-BF16"),
    ])
    def test_auto_on_a_cpu_follows_its_flags(self, flags, want, why):
        p = resolve("auto", "cpu", flags=flags)
        assert (p.dtype, p.why) == (want, why)

    @pytest.mark.parametrize("native, want", [(True, "bfloat16"), (False, "float32")])
    def test_auto_on_cuda_asks_the_gpu(self, native, want):
        p = resolve("auto", "cuda", cuda=lambda: (native, "Fake GPU"), flags=AMX)
        assert p.dtype == want and "Fake GPU" in p.why

    def test_an_explicit_dtype_is_kept_whatever_the_hardware(self):
        for dtype in ("float32", "bfloat16", "float16"):
            assert resolve(dtype, "cpu", flags=ICE_LAKE).dtype == dtype
            assert resolve(dtype, "cuda", cuda=lambda: (False, "x")).dtype == dtype

    def test_cpu_flags_are_read_from_cpuinfo(self, tmp_path):
        info = tmp_path / "cpuinfo"
        info.write_text("processor\t: 0\nmodel name\t: Fake\nflags\t\t: fpu avx2 amx_bf16\n\nprocessor\t: 1\n"
                        "flags\t\t: fpu avx2 amx_bf16\n")
        assert cpu_flags(info) == {"fpu", "avx2", "amx_bf16"}
        assert cpu_flags(tmp_path / "absent") is None
        assert resolve("auto", "cpu", flags=None).dtype in ("bfloat16", "float32")   # this machine's own answer


class TestThePlan:
    def test_auto_is_the_default(self):
        assert ModelSpec().dtype == "auto" and GraphSpec().model.dtype == "auto"

    @pytest.mark.parametrize("flags, line", [
        (AMX, "auto -> bfloat16 on pool trainer (CPU has amx_bf16)"),
        (ICE_LAKE, "auto -> float32 on pool trainer (CPU without AMX or AVX512-BF16)"),
    ])
    def test_the_plan_prints_auto_resolved_per_pool(self, monkeypatch, flags, line):
        monkeypatch.setattr(lower, "cpu_flags", lambda: flags)
        plan = og.compile(ONE_STEP_OFF, overrides=["model.dtype=auto"])
        text = str(plan)
        assert "dtype:\n  auto -> " in text and f"  {line}\n" in text
        assert plan.dtypes["rollout"].dtype == plan.dtypes["trainer"].dtype == line.split()[2]

    def test_a_gpu_pool_is_decided_on_its_actor_and_the_plan_says_so(self, monkeypatch):
        monkeypatch.setattr(lower, "cpu_flags", lambda: ICE_LAKE)
        plan = og.compile(ONE_STEP_OFF, overrides=["model.dtype=auto", "pools.rollout.gpus=1"])
        assert plan.dtypes["rollout"].dtype is None and plan.dtypes["trainer"].dtype == "float32"
        assert "auto on pool rollout: decided on the pool's GPU as it starts" in str(plan)

    def test_a_remote_cluster_decides_on_its_actors(self, monkeypatch):
        monkeypatch.setattr(lower, "cpu_flags", lambda: AMX)
        plan = og.compile(ONE_STEP_OFF, overrides=["model.dtype=auto", "runtime.address=10.0.0.1:6379"])
        assert all(p.dtype is None for p in plan.dtypes.values())

    def test_an_explicit_dtype_or_a_graph_without_a_model_prints_no_dtype(self):
        assert "dtype:" not in str(og.compile(ONE_STEP_OFF))                       # float32, as written
        assert "dtype:" not in str(og.compile(GRAPHS / "synthetic_one_step_off.yaml"))   # no model


class TestTheNodesGetTheResolvedDtype:
    def test_a_cpu_pool_gets_the_plans_answer(self, monkeypatch):
        monkeypatch.setattr(lower, "cpu_flags", lambda: ICE_LAKE)
        plan = og.compile(ONE_STEP_OFF, overrides=["model.dtype=auto"])
        ctx = build.context(plan, "update", "trainer.0", {})
        assert ctx.model.dtype == "float32"

    def test_a_gpu_pool_decides_on_its_actor_and_says_so(self, monkeypatch, capsys):
        monkeypatch.setattr(lower, "cpu_flags", lambda: ICE_LAKE)
        plan = og.compile(ONE_STEP_OFF, overrides=["model.dtype=auto", "pools.rollout.gpus=1"])
        monkeypatch.setattr(build, "device_of", lambda spec, pool: "cuda" if pool == "rollout" else "cpu")
        monkeypatch.setattr("omnigraph.planning.precision._cuda", lambda: (True, "Fake GPU"))
        monkeypatch.setattr(build, "_decided", {})
        monkeypatch.setattr(build, "_said", set())
        assert build.context(plan, "generate", "rollout.0", {}).model.dtype == "bfloat16"
        assert build.context(plan, "generate", "rollout.0", {}).model.dtype == "bfloat16"
        assert build.context(plan, "update", "trainer.0", {}).model.dtype == "float32"
        out = capsys.readouterr().out
        assert out.count("rollout.0: model.dtype auto -> bfloat16 on pool rollout (CUDA GPU Fake GPU has native "
                         "bf16)") == 1

    def test_the_generators_own_dtype_still_wins(self, monkeypatch):
        monkeypatch.setattr(lower, "cpu_flags", lambda: AMX)
        spec = og.load(ONE_STEP_OFF, ["model.dtype=auto", "nodes.generate.dtype=float32"])
        gen, ctx = build_node(spec, "generate")
        assert ctx.model.dtype == "bfloat16"
        assert {str(p.dtype) for p in gen.model.parameters()} == {"torch.float32"}


class TestTheChecksStillHold:
    def test_float16_is_still_refused_with_the_torch_trainer(self):
        with pytest.raises(GraphError) as e:
            og.compile(ONE_STEP_OFF, overrides=["model.dtype=float16"])
        assert e.value.where == "model.dtype"

    def test_auto_passes_the_trainer_check(self):
        og.compile(ONE_STEP_OFF, overrides=["model.dtype=auto"])
