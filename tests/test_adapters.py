"""The adapters to foreign libraries' private parts (``omnigraph.sdk.adapters``, ``omnigraph.executors.ray.adapter``).

For each adapter: the installed version lies in the range it was written for (a failure names the library, the
version and the range), each private name it relies on is still where it expects it (skipped only where an
optional library is not installed), and what it swaps is back when its scope ends. Process-wide signal handlers
are put back too. Fast: vLLM is imported (seconds), never started.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import inspect
import logging
import os
import signal
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from omnigraph.executors.ray import adapter as ray_adapter
from omnigraph.sdk import adapters
from omnigraph.sdk.adapters import llvmlite as llvmlite_adapter
from omnigraph.sdk.adapters import torch as torch_adapter
from omnigraph.sdk.adapters import transformers as transformers_adapter
from omnigraph.sdk.adapters import verifiers as verifiers_adapter
from omnigraph.sdk.adapters import vllm as vllm_adapter

from conftest import GRAPHS

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
HAVE_LLVMLITE = importlib.util.find_spec("llvmlite") is not None
HAVE_VERIFIERS = importlib.util.find_spec("verifiers") is not None
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vLLM is not installed (optional: pip install -e '.[vllm]')")
needs_llvmlite = pytest.mark.skipif(not HAVE_LLVMLITE, reason="llvmlite is not installed (optional: the vllm extra's numba)")

ADAPTERS = {  # adapter -> whether its library is an optional extra that may be missing
    "torch": (torch_adapter, None),
    "transformers": (transformers_adapter, None),
    "ray": (ray_adapter, None),
    "vllm": (vllm_adapter, None if HAVE_VLLM else "vLLM is not installed (optional: pip install -e '.[vllm]')"),
    "llvmlite": (llvmlite_adapter, None if HAVE_LLVMLITE else "llvmlite is not installed (optional: the vllm extra)"),
    "verifiers": (verifiers_adapter, None if HAVE_VERIFIERS else "verifiers is not installed (optional: the verifiers "
                                                                   "extra; not beside the vllm extra)"),
}


def private(module_name: str, *names: str):
    """The object at ``module_name`` then attributes ``names``; a failure naming what is missing."""
    try:
        obj = importlib.import_module(module_name)
    except ImportError as e:
        pytest.fail(f"{module_name} no longer imports ({e}): its adapter relies on it", pytrace=False)
    where = module_name
    for name in names:
        if not hasattr(obj, name):
            pytest.fail(f"{where} has no {name!r} any more: its adapter relies on it", pytrace=False)
        obj, where = getattr(obj, name), f"{where}.{name}"
    return obj


def parameters(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


# ---------------------------------------------------------------- versions


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_the_installed_version_is_in_the_adapters_range(name, monkeypatch):
    module, missing = ADAPTERS[name]
    if missing:
        pytest.skip(missing)
    monkeypatch.setattr(module, "_version", None)         # checked again, not the answer cached by earlier use
    try:
        version = module.check_version()
    except adapters.UnsupportedVersion as e:
        pytest.fail(str(e), pytrace=False)
    assert adapters.supports(version, module.SUPPORTED)


def test_a_version_outside_the_range_is_refused_naming_the_library_version_range_and_fix():
    installed = adapters.installed("torch")
    with pytest.raises(adapters.UnsupportedVersion) as e:
        adapters.check("torch", ("torch",), ">=0.1,<0.2", "omnigraph.sdk.adapters.torch")
    message = str(e.value)
    assert f"torch {installed} is installed" in message and ">=0.1,<0.2" in message
    assert "pip install 'torch>=0.1,<0.2'" in message and "tests/test_adapters.py" in message
    with pytest.raises(adapters.UnsupportedVersion, match=r"no-such-library is not installed.*fix: pip install"):
        adapters.check("no-such-library", ("omnigraph-no-such-library",), ">=1,<2", "an adapter")


def test_the_range_is_judged_by_the_release_numbers():
    assert adapters.supports("0.32.0", ">=0.32,<0.33") and adapters.supports("0.32.1.dev3+cpu", ">=0.32,<0.33")
    assert not adapters.supports("0.33.0rc1", ">=0.32,<0.33") and not adapters.supports("not a version", ">=0")


def test_an_adapter_refuses_to_reach_in_outside_its_range(monkeypatch):
    monkeypatch.setattr(torch_adapter, "_version", None)
    monkeypatch.setattr(torch_adapter, "SUPPORTED", ">=0.1,<0.2")
    with pytest.raises(adapters.UnsupportedVersion, match=r"torch .* is installed, but omnigraph.sdk.adapters.torch"):
        torch_adapter.foreach_copy_([torch.zeros(1)], [torch.ones(1)])


# ---------------------------------------------------------------- torch


def test_torch_privates_are_where_the_adapter_expects_them():
    private("torch", "_foreach_copy_")
    private("torch.cpu", "_is_amx_tile_supported")
    assert hasattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported"), "torch.ops.mkldnn._is_mkldnn_bf16_supported is gone"
    layer = torch.nn.Linear(2, 2, bias=False)
    params = torch_adapter.own_parameters(layer)
    assert isinstance(params, dict) and params["weight"] is layer.weight
    layer.weight = torch.nn.Parameter(torch.zeros(2, 2))        # a replaced parameter is seen there at once
    assert params["weight"] is layer.weight and params == dict(layer._parameters)
    assert isinstance(torch_adapter.mkldnn_bf16_supported(), bool)
    assert isinstance(torch_adapter.amx_tile_supported(), bool)


def test_foreach_copy_copies_and_casts():
    dst, src = [torch.zeros(3, dtype=torch.bfloat16), torch.zeros(2)], [torch.arange(3.0), torch.ones(2)]
    torch_adapter.foreach_copy_(dst, src)
    assert dst[0].tolist() == [0.0, 1.0, 2.0] and dst[1].tolist() == [1.0, 1.0]


def test_nccl_options_take_a_timeout():
    import torch.distributed as dist
    if not dist.is_nccl_available():
        pytest.skip("this torch build has no NCCL (a CPU build): ProcessGroupNCCL.Options is checked on GPU hosts")
    opts = torch_adapter.nccl_options(timedelta(seconds=123))
    assert opts._timeout == timedelta(seconds=123)


# ---------------------------------------------------------------- transformers


def test_transformers_privates_are_where_the_adapter_expects_them():
    from transformers import PretrainedConfig, Qwen2Config, Qwen2ForCausalLM
    private("transformers", "AutoModelForCausalLM", "_model_mapping")
    private("transformers.models.auto.tokenization_auto", "tokenizer_class_from_name")
    private("transformers.integrations.sdpa_attention", "sdpa_attention_forward")
    private("transformers.masking_utils", "sdpa_mask")
    private("transformers.masking_utils", "AttentionMaskInterface", "register")
    private("transformers", "AttentionInterface", "register")
    assert isinstance(inspect.getattr_static(PretrainedConfig, "_attn_implementation"), property)
    assert transformers_adapter.causal_lm_class(Qwen2Config()) is Qwen2ForCausalLM
    assert transformers_adapter.tokenizer_class("PreTrainedTokenizerFast") is not None
    assert transformers_adapter.attn_implementation(Qwen2Config(attn_implementation="eager")) == "eager"
    assert callable(transformers_adapter.sdpa_attention_forward())
    from transformers import DynamicCache
    cache = DynamicCache(config=Qwen2Config(num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                            hidden_size=8))
    for i in range(2):
        cache.update(torch.arange(12.0).view(3, 1, 2, 2) + i, torch.zeros(3, 1, 2, 2), i)
    transformers_adapter.repeat_cache_rows(cache, torch.tensor([2, 0, 2, 2]))
    assert [layer.keys[:, 0, 0, 0].tolist() for layer in cache.layers] == [[8, 0, 8, 8], [9, 1, 9, 9]]
    assert cache.layers[0].values.shape == (4, 1, 2, 2)


def test_a_patch_grid_models_rope_index_and_deltas_are_where_the_adapter_expects_them():
    from transformers import Qwen2_5_VLModel, Qwen2VLModel
    for cls in (Qwen2VLModel, Qwen2_5_VLModel):
        assert "mm_token_type_ids" in inspect.signature(cls.get_rope_index).parameters
        assert "rope_deltas" in inspect.getsource(cls.__init__)
    from transformers import Qwen2_5_VLForConditionalGeneration
    prepare = Qwen2_5_VLForConditionalGeneration._prepare_position_ids_for_generation
    assert "mm_token_type_ids" in inspect.getsource(prepare)
    assert transformers_adapter.has_rope_index(torch.nn.Linear(1, 1)) is False
    assert transformers_adapter.generate_inputs(torch.nn.Linear(1, 1), torch.zeros(1, 1)) == {}


def test_the_tiny_reward_models_tokenizer_has_a_public_backend():
    from nodes.zoo.tiny_rm import build_tokenizer_rm
    tok = build_tokenizer_rm()                    # sets its post-processor through tok.backend_tokenizer
    ids = tok("12")["input_ids"]
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id


# ---------------------------------------------------------------- llvmlite


@needs_llvmlite
def test_llvmlite_library_handle_answers_vars_with_an_empty_dict():
    from llvmlite.binding import ffi
    assert "_fntab" in type(ffi.lib).__slots__ and isinstance(private("llvmlite.binding.ffi", "lib", "_fntab"), dict)
    llvmlite_adapter.give_lib_a_dict()           # kept for the process, as the CPU kernels keep it
    llvmlite_adapter.give_lib_a_dict()
    assert vars(ffi.lib) == {} and ffi.lib.__dict__.get("anything") is None


# ---------------------------------------------------------------- vLLM


@needs_vllm
def test_vllm_privates_are_where_the_adapter_expects_them():
    import vllm
    dispatch = private("vllm.model_executor.layers.utils", "dispatch_cpu_unquantized_gemm")
    assert parameters(dispatch)[:2] == ["layer", "remove_weight"]
    private("vllm.v1.sample.sampler", "batched_count_greater_than")
    assert parameters(private("vllm._custom_ops", "weight_packed_linear_cpu"))[:4] == ["x", "packed_weight", "n",
                                                                                        "bias"]
    private("vllm.model_executor.layers.linear", "UnquantizedLinearMethod", "process_weights_after_loading")
    engine = private("vllm.v1.engine.llm_engine", "LLMEngine")
    assert [m for m in vllm_adapter.ENGINE_METHODS if not hasattr(engine, m)] == []
    assert "self.llm_engine =" in inspect.getsource(vllm.LLM.__init__), "vllm.LLM no longer sets self.llm_engine"
    private("vllm.v1.worker.gpu_worker", "Worker", "reload_weights")
    assert "self.vllm_config = " in inspect.getsource(private("vllm.v1.worker.worker_base", "WorkerBase").__init__)
    assert "self.model_runner = " in inspect.getsource(private("vllm.v1.worker.cpu_worker", "CPUWorker"))
    for module, cls in [("vllm.v1.worker.cpu_model_runner", "CPUModelRunner"),
                        ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner"),
                        ("vllm.v1.worker.gpu.model_runner", "GPUModelRunner")]:
        runner = private(module, cls)
        assert hasattr(runner, "get_model"), f"{module}.{cls} has no get_model"
        assert {"weights_iterator", "is_checkpoint_format"} <= set(parameters(runner.reload_weights)), \
            f"{module}.{cls}.reload_weights takes other arguments"
    assert isinstance(vllm_adapter.has_packed_kernels(), bool)
    if torch_adapter.amx_tile_supported():       # sgl-kernel's packing is built and used only on AMX CPUs
        assert vllm_adapter.has_packed_kernels(), "torch.ops._C.convert_weight_packed is gone on an AMX CPU"


@needs_vllm
def test_the_rank_count_is_vllms_own_again_when_the_last_block_ends():
    import vllm.v1.sample.sampler as sampler
    original = sampler.batched_count_greater_than

    def count(x, values):
        return (x >= values).sum(-1)

    with vllm_adapter.counting_ranks_with(count):
        assert sampler.batched_count_greater_than is count
        with vllm_adapter.counting_ranks_with(count):          # a second engine in the process
            pass
        assert sampler.batched_count_greater_than is count
        with pytest.raises(RuntimeError, match="another function"), \
                vllm_adapter.counting_ranks_with(lambda x, v: None):
            pass
        assert sampler.batched_count_greater_than is count
    assert sampler.batched_count_greater_than is original
    with pytest.raises(ValueError), vllm_adapter.counting_ranks_with(count):
        raise ValueError("the engine failed")
    assert sampler.batched_count_greater_than is original
    # blocks that end out of order (engines collected in any order)
    first, second = vllm_adapter.counting_ranks_with(count), vllm_adapter.counting_ranks_with(count)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert sampler.batched_count_greater_than is count
    second.__exit__(None, None, None)
    assert sampler.batched_count_greater_than is original


@needs_vllm
def test_the_repack_watch_is_undone_when_its_block_ends():
    from vllm.model_executor.layers import utils
    original = utils.dispatch_cpu_unquantized_gemm
    seen = []
    layer = SimpleNamespace(weight=torch.empty(4, 4, device="meta"))       # vLLM skips missing (meta) layers
    with vllm_adapter.watching_repacks(lambda layer, remove: seen.append((layer, remove))):
        assert utils.dispatch_cpu_unquantized_gemm is not original
        vllm_adapter.repack(layer)
    assert utils.dispatch_cpu_unquantized_gemm is original
    assert seen == [(layer, True)] and layer.cpu_linear is torch.nn.functional.linear
    with pytest.raises(KeyError), vllm_adapter.watching_repacks(lambda *a: None):
        raise KeyError("a load that failed")
    assert utils.dispatch_cpu_unquantized_gemm is original


@needs_vllm
def test_the_engine_and_worker_accessors():
    calls = []
    engine = SimpleNamespace(add_lora=lambda r: calls.append(("add", r)), remove_lora=lambda i: calls.append(("rm", i)))
    llm = SimpleNamespace(llm_engine=engine)
    assert vllm_adapter.engine(llm) is engine
    vllm_adapter.add_lora(llm, "request")
    vllm_adapter.remove_lora(llm, 3)
    assert calls == [("add", "request"), ("rm", 3)]
    model, config = object(), object()
    worker = SimpleNamespace(model_runner=SimpleNamespace(get_model=lambda: model), vllm_config=config,
                             reload_weights=lambda **kw: calls.append(kw))
    assert vllm_adapter.worker_model(worker) is model and vllm_adapter.worker_config(worker) is config
    vllm_adapter.reload_weights(worker, {"w": 1})
    assert list(calls[-1]["weights_iterator"]) == [("w", 1)] and calls[-1]["is_checkpoint_format"] is True
    layer = SimpleNamespace()
    vllm_adapter.compute_from_packed(layer, torch.empty(0), 4)
    assert callable(layer.cpu_linear)


class _FakeLLM:
    """Stands in for ``vllm.LLM``: the node's own set-up runs, no engine starts."""

    def __init__(self, **kwargs):
        self.kwargs = kwargs


@contextlib.contextmanager
def _environment_kept():
    saved = dict(os.environ)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@needs_vllm
def test_the_vllm_node_counts_ranks_eagerly_only_while_its_engine_lives(monkeypatch):
    import vllm
    import vllm.v1.sample.sampler as sampler

    import omnigraph as og
    from omnigraph.testing import build_node

    from nodes.rollout import vllm_engine
    original = sampler.batched_count_greater_than
    monkeypatch.setattr(vllm, "LLM", _FakeLLM)
    monkeypatch.setattr(vllm_engine, "keep_freed_memory", lambda: True)   # leave this process's malloc alone
    spec = og.load(GRAPHS / "grpo_sync.yaml", ["nodes.generate.backend=vllm"])
    with _environment_kept():
        gen, _ = build_node(spec, "generate")
        assert sampler.batched_count_greater_than is vllm_engine._count_ranks
        gen.close()                                                       # shut down: vLLM's own count again
        assert sampler.batched_count_greater_than is original
        gen, _ = build_node(spec, "generate")
        assert sampler.batched_count_greater_than is vllm_engine._count_ranks
        del gen, _
        gc.collect()                                                      # the engine collected: the same
        assert sampler.batched_count_greater_than is original

        def fail(**kwargs):
            raise RuntimeError("the engine did not start")

        monkeypatch.setattr(vllm, "LLM", fail)
        with pytest.raises(RuntimeError, match="did not start"):
            build_node(spec, "generate")
        assert sampler.batched_count_greater_than is original


# ---------------------------------------------------------------- verifiers


def test_building_off_the_main_thread_puts_signal_signal_back():
    from nodes.envs.verifiers_adapter import _no_signal_handlers
    install = signal.signal
    with pytest.raises(ValueError), _no_signal_handlers():
        assert signal.signal is not install
        assert signal.signal(signal.SIGUSR2, lambda *_: None) is signal.getsignal(signal.SIGUSR2)
        raise ValueError("the environment failed to build")
    assert signal.signal is install


@pytest.mark.skipif(not HAVE_VERIFIERS, reason="verifiers is not installed (optional: the verifiers extra)")
def test_verifiers_internals_are_where_the_adapter_expects_them():
    from nodes.envs.verifiers_adapter import verifiers
    from omnigraph.sdk import ConfigError
    try:
        stack = verifiers()
    except ConfigError as e:
        pytest.fail(str(e), pytrace=False)
    assert callable(verifiers_adapter.normalize_messages(stack))


# ---------------------------------------------------------------- Ray


def test_ray_privates_are_where_the_adapter_expects_them():
    node = private("ray._private.node", "Node")
    params = private("ray._private.parameter", "RayParams")
    assert {"include_dashboard", "no_monitor", "worker_path", "env_vars", "_system_config"} <= set(parameters(params))
    assert {"ray_params", "head", "shutdown_at_exit", "spawn_reaper", "ray_init_cluster"} <= set(parameters(node))
    assert {"check_alive", "allow_graceful"} <= set(parameters(node.kill_all_processes))
    assert callable(node.destroy_external_storage) and isinstance(inspect.getattr_static(node, "address"), property)
    raylet = private("ray._raylet").__file__           # the system config key is compiled into Ray's core
    assert b"prestart_worker_first_driver" in Path(raylet).read_bytes(), \
        "Ray no longer knows the system config prestart_worker_first_driver"
    assert isinstance(inspect.getattr_static(private("ray.actor", "ActorHandle"), "_actor_id"), property)
    assert importlib.util.find_spec(ray_adapter.COMPILED_DAG_LOGGER) is not None
    assert Path(ray_adapter.default_worker()).is_file()
    assert ray_adapter.worker_env() == {ray_adapter.WORKER_ENV: ray_adapter.default_worker()}
    handle = SimpleNamespace(_actor_id=SimpleNamespace(hex=lambda: "a1b2"))
    assert ray_adapter.actor_id(handle) == "a1b2"


def test_the_compiled_graph_logger_gets_its_level_back():
    logger = logging.getLogger(ray_adapter.COMPILED_DAG_LOGGER)
    before = logger.level
    with pytest.raises(RuntimeError), ray_adapter.quiet_compiled_dag():
        assert logger.level == logging.CRITICAL
        raise RuntimeError("teardown failed")
    assert logger.level == before


def test_the_warm_launcher_runs_the_worker_the_executor_names(monkeypatch):
    from omnigraph.executors.ray import warm_launch
    # the launcher imports nothing of omnigraph: it reads the variable by its name, the adapter's
    assert f'os.environ.get("{ray_adapter.WORKER_ENV}")' in Path(warm_launch.__file__).read_text()
    monkeypatch.delenv(ray_adapter.WORKER_ENV, raising=False)
    with pytest.raises(SystemExit, match=ray_adapter.WORKER_ENV):
        warm_launch._plain_worker()


# ---------------------------------------------------------------- signal handlers


def _handlers(signals) -> dict:
    return {s: signal.getsignal(s) for s in signals}


def test_the_warm_launcher_and_server_put_the_signal_handlers_back():
    from omnigraph.executors.ray import warm_launch, warm_server
    before = _handlers(warm_launch.FORWARDED)
    with warm_launch.forwarding(os.getpid()):
        assert all(signal.getsignal(s) is not h for s, h in before.items())
    assert _handlers(warm_launch.FORWARDED) == before
    before = _handlers([signal.SIGCHLD, signal.SIGTERM])
    with pytest.raises(KeyError), warm_server.handling({signal.SIGCHLD: lambda *_: None,
                                                        signal.SIGTERM: lambda *_: None}):
        assert signal.getsignal(signal.SIGTERM) is not before[signal.SIGTERM]
        raise KeyError("the server failed")
    assert _handlers([signal.SIGCHLD, signal.SIGTERM]) == before


def test_deferred_puts_the_previous_handlers_back():
    from omnigraph.runtime import interrupt
    signals = [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1]
    before = _handlers(signals)
    with pytest.raises(ValueError), interrupt.deferred("USR1"):
        assert all(signal.getsignal(s) is interrupt._handler for s in signals)
        raise ValueError("the run failed")
    assert _handlers(signals) == before and interrupt.requested() is None
    with pytest.raises(KeyError), interrupt.deferred("NOSUCHSIGNAL"):
        pass
    assert _handlers(signals) == before
