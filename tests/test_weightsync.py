"""Weights transports, the parts that need no GPU: the path choice (once, in the plan), groups, the NCCL
bucket layout and metadata, and the send/receive logic itself over gloo between two CPU processes
(tests/test_gpu_multi.py runs it on NCCL)."""

import os
import pickle
import random
import subprocess
import sys

import pytest
import torch

import omnigraph as og
from omnigraph.sdk import Weights
from omnigraph.transports import choose
from omnigraph.transports.nccl import ALIGN, Entry, Nccl, describe, fetch, layout

from conftest import GRAPHS, ROOT

TWO_GPU = GRAPHS / "gpu" / "grpo_one_step_off_2gpu.yaml"


def spec(*overrides):
    return og.load(TWO_GPU, list(overrides))


@pytest.mark.parametrize("trainer, rollout, want", [
    ("1", "1", "nccl"), ("1", "2", "nccl"), ("2", "1", "nccl"),
    ("0.5", "0.5", "cuda-ipc"), ("1", "0.5", "host"), ("0.5", "1", "host"), ("0", "1", "shm"), ("0", "0", "shm")])
def test_the_path_follows_the_placement(trainer, rollout, want):
    s = spec(f"pools.trainer.gpus={trainer}", f"pools.rollout.gpus={rollout}")
    assert choose(s, "sync") == want
    assert og.compile(s).weights == {"sync": want}          # chosen once, in the plan


def weights_edge(tmp_path, transport: str):
    text = TWO_GPU.read_text().replace("- sync -> generate: {delay: 1}",
                                       f"- sync -> generate: {{delay: 1, transport: {transport}}}")
    (tmp_path / "g.yaml").write_text(text)
    return tmp_path / "g.yaml"


def test_the_weights_edge_names_the_path_and_a_cluster_keeps_weights_off_ipc(tmp_path):
    assert choose(og.load(weights_edge(tmp_path, "channel")), "sync") == "channel"
    assert choose(og.load(weights_edge(tmp_path, "host")), "sync") == "host"
    half = spec("pools.trainer.gpus=0.5", "pools.rollout.gpus=0.5", "runtime.address=10.0.0.1:6379")
    assert choose(half, "sync") == "host"          # two hosts: no shared card, no IPC
    assert choose(spec("runtime.executor=local"), "sync") == "channel"      # one process: handed over as is


def test_plan_sends_weights_over_nccl_and_batches_through_shared_memory():
    plan = og.compile(TWO_GPU)
    remote = {(c.edge.src, c.transport) for c in plan.channels if c.src.actor != c.dst.actor}
    assert remote == {("reward", "shm"), ("sync", "nccl")}
    groups = {g.name: list(g.members) for g in plan.groups}
    assert groups == {"weights-sync": ["trainer.0", "rollout.0"]}
    wide = og.compile(TWO_GPU, overrides=["pools.rollout.actors=2"])
    assert {g.name: list(g.members) for g in wide.groups} == {"weights-sync": ["trainer.0", "rollout.0", "rollout.1"]}
    shared = og.compile(TWO_GPU, overrides=["pools.trainer.gpus=0.5", "pools.rollout.gpus=0.5"])
    assert shared.groups == []
    assert {c.transport for c in shared.channels if c.edge.state and c.src.actor != c.dst.actor} == {"cuda-ipc"}
    assert "sync -> generate  by nccl" in str(plan) and "weights-sync  nccl weights: trainer.0, rollout.0" in str(plan)


def test_a_path_asked_for_where_it_cannot_work_is_a_clear_error(tmp_path):
    og.compile(weights_edge(tmp_path, "nccl"))                        # whole GPUs: fine
    with pytest.raises(og.GraphError, match="transport: nccl on the weights edge") as e:
        og.compile(weights_edge(tmp_path, "nccl"), overrides=["pools.rollout.gpus=0.5", "pools.trainer.gpus=0.5"])
    assert "gpus: 1" in str(e.value)
    with pytest.raises(og.GraphError, match="transport: cuda-ipc .* sharing one GPU"):
        og.compile(weights_edge(tmp_path, "cuda-ipc"))
    with pytest.raises(og.GraphError, match="unknown weights transport 'nvlink'"):
        og.compile(weights_edge(tmp_path, "nvlink"))


def test_buckets_cover_every_element_once_aligned_and_bounded():
    rng = random.Random(0)
    dtypes = ["bfloat16", "float32", "int64", "float16", "uint8"]
    for trial in range(30):
        entries = [Entry(f"t{i}", rng.choice(dtypes), tuple(rng.randint(1, 40) for _ in range(rng.randint(0, 3))))
                   for i in range(rng.randint(1, 25))]
        cap = rng.choice([ALIGN, 512, 1000, 4096, 1 << 20])
        buckets = layout(entries, cap)
        seen = {e.name: [] for e in entries}
        for b in buckets:
            assert 0 < b.nbytes <= cap and b.pieces
            end = 0
            for p in b.pieces:
                size = torch.empty(0, dtype=getattr(torch, next(e.dtype for e in entries if e.name == p.name))).element_size()
                assert p.offset % ALIGN == 0 and p.offset >= end and p.numel > 0
                end = p.offset + p.numel * size
                seen[p.name].append((p.start, p.numel))
            assert end == b.nbytes
        for e in entries:
            spans = sorted(seen[e.name])
            assert sum(n for _, n in spans) == e.numel, (trial, e)
            assert all(a + n == b for (a, n), (b, _) in zip(spans, spans[1:]))


def test_the_description_is_small_tied_weights_go_once_and_it_says_nccl():
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.for_model("qwen2", hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                               num_key_value_heads=2, intermediate_size=128, vocab_size=5000, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(cfg)
    state = model.state_dict()
    meta = describe(state, "weights-sync", dtype=torch.bfloat16, bucket_bytes=64 << 10)
    assert meta.aliases == {"lm_head.weight": "model.embed_tokens.weight"}
    assert set(meta.names()) == set(state) and len(meta) == len(state)
    assert {e.dtype for e in meta.entries} == {"bfloat16"}
    assert meta.nbytes >= 2 * sum(t.numel() for k, t in state.items() if k != "lm_head.weight")
    assert max(b.nbytes for b in meta.buckets) <= 64 << 10 and len(meta.buckets) > 10
    w = Weights(3, tensors=meta, payload="full", nbytes=meta.nbytes, path="nccl")
    blob = pickle.dumps(w)
    assert len(blob) < 32 << 10 and pickle.loads(blob).tensors.nbytes == meta.nbytes
    assert "tensors=" in repr(w) and "buckets" in repr(meta)


WORKER = r"""
import json, sys, torch
from omnigraph.transports import groups, nccl as weightsync
rank, port, bucket, backend = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dev = "cuda" if backend == "nccl" else "cpu"
n = 300 if dev == "cpu" else 3000
torch.manual_seed(0)
big = torch.randn(n, 70)                           # larger than a bucket: split over several
src = {"emb": big, "head": big, "norm": torch.randn(70), "steps": torch.arange(9), "lora_A": torch.randn(4, 70)}
src = {k: v.to(dev) for k, v in src.items()}
src["head"] = src["emb"]
g = groups.join("t", "127.0.0.1", port, rank, 2, backend=backend)
want = {k: (v.to(torch.bfloat16) if v.is_floating_point() else v) for k, v in src.items()}
if rank == 0:
    meta = weightsync.describe(src, g.name, dtype=torch.bfloat16, bucket_bytes=bucket)
    g.store.set("meta", __import__("pickle").dumps(meta))
    for v in range(2):
        weightsync.send(meta, {k: t * (v + 1) if t.is_floating_point() else t for k, t in src.items()}, g)
    g.store.wait(["done"])
    for w in g.inflight.values():                  # the last broadcasts are done before the process exits
        w.wait()
    print(json.dumps({"buckets": len(meta.buckets), "aliases": meta.aliases}))
else:
    meta = __import__("pickle").loads(g.store.get("meta"))
    emb = torch.zeros(n, 70, dtype=torch.bfloat16, device=dev)
    into = {"emb": emb, "head": emb, "norm": torch.zeros(70, dtype=torch.bfloat16, device=dev),
            "steps": torch.zeros(9, dtype=torch.int64, device=dev),
            "lora_A": torch.zeros(4, 70, dtype=torch.bfloat16, device=dev)}
    weightsync.receive(meta, g, into)                              # into the model's own tensors
    ok1 = all(torch.equal(into[k], want[k]) for k in src)
    got = weightsync.fetch(meta, g)                                # into fresh tensors
    ok2 = all(torch.equal(got[k], (src[k] * 2).to(torch.bfloat16) if src[k].is_floating_point() else src[k]) for k in src)
    g.store.set("done", "1")
    print(json.dumps({"direct": ok1, "fetched": ok2, "tied": got["emb"].data_ptr() == got["head"].data_ptr()}))
# exit without destructors: a gloo group torn down at interpreter exit aborts now and then (measured 5 of 52
# runs: "terminate called without an active exception", exit -6) after every result is in
sys.stdout.flush()
__import__("os")._exit(0)
"""


def two_processes(backend: str, bucket: int) -> tuple[dict, dict]:
    """Run WORKER as rank 0 (sender) and rank 1 (receiver); on nccl each process sees one GPU."""
    import json

    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(r), str(store.port), str(bucket), backend], cwd=ROOT,
                              env=env | ({"CUDA_VISIBLE_DEVICES": str(r)} if backend == "nccl" else {}),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=180) for p in procs]
    report = "\n".join(f"rank {r} (exit {p.returncode}):\n{out[-1000:]}\n{err[-3000:]}"
                       for r, (p, (out, err)) in enumerate(zip(procs, outs)))
    assert all(p.returncode == 0 for p in procs), report
    lines = [[x for x in out.splitlines() if x.startswith("{")] for out, _ in outs]
    assert all(lines), report
    sender, receiver = (json.loads(x[-1]) for x in lines)
    return sender, receiver


def test_send_and_receive_between_two_processes_over_gloo():
    sender, receiver = two_processes("gloo", 4096)
    assert sender["buckets"] > 5 and sender["aliases"] == {"head": "emb"}
    assert receiver == {"direct": True, "fetched": True, "tied": True}


def test_weights_arriving_without_a_group_say_what_is_wrong():
    meta = describe({"a": torch.zeros(4)}, "weights-nowhere")
    with pytest.raises(RuntimeError, match="not in that group"):
        fetch(meta)
    with pytest.raises(RuntimeError, match="not in that group"):
        Nccl("sync").arrive(Weights(2, tensors=meta), targets={"a": torch.zeros(4)})
    with pytest.raises(RuntimeError, match="needs the group the executor forms"):
        Nccl("sync").export(__import__("omnigraph").sdk.WeightsState({"a": torch.zeros(4)}), 1)


def test_the_rollout_takes_nccl_weights_on_arrival_into_its_model_when_the_next_read_is_them(monkeypatch):
    """The interpreter hands the transport the generator's own tensors when the next read is this value."""
    from types import SimpleNamespace

    from omnigraph.executors.interpreter import Interpreter
    from omnigraph.transports import nccl

    seen = []
    monkeypatch.setattr(nccl, "receive", lambda meta, g, targets: seen.append(targets))
    monkeypatch.setattr(nccl, "member", lambda name: None)
    monkeypatch.setattr(nccl, "fetch", lambda meta: {"a": torch.ones(4)})

    class Rollout:
        def weight_targets(self, payload):
            return {"a": torch.zeros(4)}

    meta = describe({"a": torch.zeros(4)}, "weights-nowhere")
    me = SimpleNamespace(nodes={"generate": Rollout()}, plan=SimpleNamespace(weights={"sync": "nccl"}),
                         transport=lambda name: Nccl(name))
    edge = SimpleNamespace(src="sync", dst="generate", delay=1)
    got = Interpreter._arrive(me, edge, Weights(2, tensors=meta, path="nccl"))
    assert got.version == 2 and got.loaded and got.tensors is None and len(seen) == 1
    plain = Weights(3, tensors={"a": torch.zeros(4)})
    assert Interpreter._arrive(me, edge, plain) is plain
    deeper = Interpreter._arrive(me, SimpleNamespace(src="sync", dst="generate", delay=2), Weights(2, tensors=meta))
    assert not deeper.loaded and torch.equal(deeper.tensors["a"], torch.ones(4)) and len(seen) == 1


def test_compiled_graphs_get_no_ray_nccl_hint_between_whole_gpus():
    from omnigraph.executors.ray.program import program
    from omnigraph.executors.ray.compiled import RayCompiledExecutor
    for gpus, want in (("1", set()), ("0", {"auto"})):
        plan = og.compile(TWO_GPU, overrides=[f"pools.trainer.gpus={gpus}", f"pools.rollout.gpus={gpus}"])
        ex = RayCompiledExecutor(plan)
        ex.ops = program(plan, waits=False)
        assert set(ex._transports().values()) == want


def test_channels_are_sized_for_what_crosses_them(tmp_path):
    """On one host's CPUs only a /dev/shm file name crosses: the compiled graph's channels stay small; on a
    cluster the weights themselves cross, so every channel buffer must hold them (a channel that grows
    later hangs Ray's teardown)."""
    from omnigraph import plugins
    from omnigraph.executors.ray.common import MIN_BUFFER, channel_bytes
    one_step_off = GRAPHS / "grpo_one_step_off.yaml"
    local = og.compile(og.load(one_step_off, ["model.path=smollm2-135m"]))    # never materialised: not needed
    assert local.weights == {"sync": "shm"} and channel_bytes(local) == MIN_BUFFER
    cluster = og.compile(og.load(one_step_off, ["runtime.address=10.0.0.1:6379"]))
    model = plugins.model_dir("tiny", cluster.graph.spec.model.seed)
    weights = sum(f.stat().st_size for f in model.glob("*.safetensors"))
    assert cluster.weights == {"sync": "host"} and channel_bytes(cluster) >= weights
    tiny = og.compile(og.load(one_step_off))
    assert channel_bytes(tiny) == MIN_BUFFER
    text = one_step_off.read_text().replace("- sync -> generate: {delay: 1}", "- sync -> generate: {delay: 1, transport: host}")
    (tmp_path / "host.yaml").write_text(text)
    forced = og.compile(tmp_path / "host.yaml")                                # asked for: the tensors cross
    assert forced.weights == {"sync": "host"} and channel_bytes(forced) >= weights


@pytest.mark.parametrize("executor", ["local", "ray"])
def test_a_run_uses_the_weights_path_its_plan_printed(tmp_path, executor):
    import os

    from omnigraph.runtime import run
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    plan = og.compile(GRAPHS / "grpo_one_step_off.yaml", overrides=["schedule.iterations=3", f"runtime.executor={executor}",
                                                                    "nodes.generate.eval_every=0"])
    res = run(plan, run_dir=tmp_path, progress=False)
    printed = (res.run_dir / "plan.txt").read_text()
    path = plan.weights["sync"]
    assert f"sync -> generate  by {path}" in printed and path == {"local": "channel", "ray": "shm"}[executor]
    used = {r["weights_path"] for r in res.metrics if "weights_path" in r}
    assert used == {path}


class TestCudaIpcAtDeviceCopySpeed:
    """The cuda-ipc path's logic on CPU tensors, in one process (tests/test_gpu.py crosses processes on CUDA)."""

    def state(self, scale=1.0):
        from omnigraph.sdk import WeightsState
        w = torch.arange(12.0).reshape(3, 4) * scale
        return WeightsState({"w": w, "tied": w, "b": torch.ones(5) * scale, "step": torch.tensor(3)}, "full",
                            torch.bfloat16)

    def test_a_pack_refills_in_place_only_with_what_it_was_packed_from(self):
        from omnigraph.transports.pack import TensorPack
        s = self.state()
        pack = TensorPack.pack(s.tensors, dtype=torch.bfloat16)
        buffers = {dt: b.data_ptr() for dt, b in pack.buffers.items()}
        again = self.state(2.0).tensors
        assert pack.refill(again, dtype=torch.bfloat16)
        assert {dt: b.data_ptr() for dt, b in pack.buffers.items()} == buffers
        assert torch.equal(pack["tied"], (torch.arange(12.0).reshape(3, 4) * 2).to(torch.bfloat16))
        assert not pack.refill(again)                                           # another wire dtype
        assert not pack.refill({**again, "tied": again["w"].clone()}, dtype=torch.bfloat16)   # no longer tied
        assert not pack.refill({k: v for k, v in again.items() if k != "b"}, dtype=torch.bfloat16)
        assert not pack.refill({**again, "b": torch.ones(6)}, dtype=torch.bfloat16)

    def test_the_sender_refills_its_packs_in_turn_and_the_receiver_copies_into_the_model(self):
        from omnigraph.transports.packed import KEEP, CudaIpc
        tx = CudaIpc("sync")
        try:
            sent = [tx.export(self.state(v), v) for v in range(1, KEEP + 2)]
            assert sent[0].tensors is sent[KEEP].tensors and len({id(w.tensors) for w in sent}) == KEEP
            model = {"w": torch.zeros(3, 4, dtype=torch.bfloat16), "b": torch.zeros(5, dtype=torch.bfloat16),
                     "step": torch.tensor(0)}
            model["tied"] = model["w"]
            got = tx.arrive(sent[-1], model)
            assert got.loaded and got.tensors is None and got.version == KEEP + 1 and got.arrive_s > 0
            assert torch.equal(model["tied"], (torch.arange(12.0).reshape(3, 4) * (KEEP + 1)).to(torch.bfloat16))
            kept = tx.arrive(sent[-2], None)                    # kept for later (delay > 1): its own copy
            assert not kept.loaded and kept.tensors is not sent[-2].tensors
            assert all(kept.tensors.buffers[dt].data_ptr() != b.data_ptr() for dt, b in sent[-2].tensors.buffers.items())
            assert torch.equal(kept.tensors["b"], torch.full((5,), float(KEEP), dtype=torch.bfloat16))
        finally:
            tx.close()

    def test_a_receiver_refuses_weights_the_sender_has_overwritten(self):
        from omnigraph.transports.packed import KEEP, CudaIpc
        tx = CudaIpc("sync")
        try:
            first = tx.export(self.state(1), 1)
            for v in range(2, KEEP + 2):
                tx.export(self.state(v), v)
            with pytest.raises(RuntimeError, match=rf"weights version 1 was overwritten by the sender before this "
                                                   rf"receiver copied it \(its buffer now holds {KEEP + 1}\)"):
                tx.arrive(first, None)
        finally:
            tx.close()

    def test_checkpoints_hold_host_tensors_not_stamps(self):
        from omnigraph.transports.base import portable
        from omnigraph.transports.packed import CudaIpc
        tx = CudaIpc("sync")
        try:
            w = tx.export(self.state(), 1)
            with portable():
                back = pickle.loads(pickle.dumps(w))
            assert getattr(back.tensors, "stamp", None) is None and back.tensors.path == "host"
        finally:
            tx.close()


def test_copy_into_names_what_does_not_match():
    from omnigraph.sdk import ConfigError, copy_into
    model = {"a": torch.zeros(2), "b": torch.zeros(3)}
    with pytest.raises(ConfigError, match=r"the weights do not match the model: missing b; unexpected c"):
        copy_into(model, {"a": torch.ones(2), "c": torch.ones(3)})
    with pytest.raises(ConfigError, match=r"b is \(4,\) in the weights and \(3,\) in the model"):
        copy_into(model, {"a": torch.ones(2), "b": torch.ones(4)})
    plans = {}
    src = {"a": torch.ones(2), "b": torch.arange(3.0)}
    copy_into(model, src, plans)
    copy_into(model, src, plans)
    assert len(plans) == 1 and model["b"].tolist() == [0.0, 1.0, 2.0]


def test_sync_hands_the_same_mapping_while_the_parameters_are_the_same():
    from omnigraph.testing import build_node
    s = og.load(GRAPHS / "grpo_one_step_off.yaml", ["schedule.iterations=2"])
    sync, _ = build_node(s, "sync")
    first = sync.state().tensors
    assert sync.state().tensors is first
    p = next(sync.policy.model.parameters())
    p.data = p.data.clone()                            # replaced, not written in place
    assert sync.state().tensors is not first


@pytest.mark.parametrize("in_flight, readable", [(None, [3, 4, 5]), (5, [1, 2, 3, 4, 5])])
def test_the_cuda_ipc_ring_holds_as_many_unread_exports_as_the_plan_allows(in_flight, readable):
    """The stamp logic on CPU packs: five exports before any is read; the sender keeps KEEP (3) by default and
    the plan's bound + 1 when that is more; a receiver of an overwritten version is refused, never torn."""
    from omnigraph.sdk import WeightsState
    from omnigraph.transports import make
    tx = make("cuda-ipc", "sync", None, in_flight=in_flight)
    src, sent = {"a": torch.zeros(4)}, []
    for v in range(1, 6):
        src["a"].fill_(v)
        sent.append(tx.export(WeightsState(src, "full", torch.float32), v))
    rx = make("cuda-ipc", "sync")
    try:
        for w in sent:
            if w.version in readable:
                assert torch.equal(rx.arrive(w).tensors["a"], torch.full((4,), float(w.version)))
            else:
                with pytest.raises(RuntimeError, match=f"weights version {w.version} was overwritten by the sender "
                                                       "before this receiver copied it .* the sender keeps 3"):
                    rx.arrive(w)
    finally:
        tx.close()


def test_the_interpreter_sizes_the_weights_ring_from_the_staleness_bound():
    from omnigraph.executors.interpreter import Interpreter
    plan = og.compile(GRAPHS / "grpo_async.yaml", overrides=["schedule.ahead=4", "schedule.max_staleness=4"])
    (actor,) = [t.actor for t in plan.tasks if t.op == "run" and t.node == "sync"][:1]
    t = Interpreter(plan, actor).transport("sync")
    assert plan.bound == 4 and t.in_flight == 5


def test_the_exported_state_follows_a_replaced_parameter():
    """A parameter replaced by a new one (a restore, a merge) is exported, not the old one the cache saw."""
    from omnigraph.testing import build_node
    sync, _ = build_node(og.load(GRAPHS / "grpo_sync.yaml"), "sync")
    first = sync.state().tensors
    name, p = next(iter(sync.policy.model.named_parameters()))
    owner = sync.policy.model.get_submodule(name.rsplit(".", 1)[0])
    setattr(owner, name.rsplit(".", 1)[1], torch.nn.Parameter(torch.full_like(p, 0.5)))
    state = sync.state().tensors
    assert state is not first and torch.equal(state[name], torch.full_like(p, 0.5))

