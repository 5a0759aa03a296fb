"""``sync: {payload: delta}``: only the changed values travel, checked on arrival; a mismatch re-seeds densely."""

import json
import os

import pytest
import torch

import omnigraph as og
from omnigraph.cli import main
from omnigraph.runtime import run
from omnigraph.transports.delta import HEAD, DeltaMismatch, Encoder, apply, delta_bytes

from conftest import GRAPHS, ROOT

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
GRAPH = str(GRAPHS / "grpo_one_step_off.yaml")


def weights(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {"a": torch.randn(64, 32, generator=g).to(torch.bfloat16), "b": torch.randn(1000, generator=g),
            "steps": torch.tensor([3])}


def step(w, frac, seed):
    """Change about ``frac`` of each floating tensor's values."""
    g = torch.Generator().manual_seed(seed)
    for t in w.values():
        if t.is_floating_point():
            mask = torch.rand(t.shape, generator=g) < frac
            t[mask] = (t[mask].float() + 0.5).to(t.dtype)


def test_a_chain_of_deltas_rebuilds_the_sender_bit_for_bit_and_sends_only_what_changed():
    w, enc = weights(), Encoder()
    first = enc.encode(w, None, version=1)
    assert first.payload == "full"
    mine = {k: v.clone() for k, v in first.tensors.items()}
    held = 1
    for v in range(2, 7):
        step(w, 0.05, v)
        d = enc.encode(w, None, version=v)
        assert d.payload == "delta" and int(d.tensors[HEAD][0]) == held
        assert delta_bytes(d.tensors) < 0.2 * enc.dense_bytes        # 5% changed: positions + values
        apply(d.tensors, mine, held)
        held = v
        assert all(torch.equal(mine[k].view(-1).view(torch.uint8), w[k].view(-1).view(torch.uint8)) for k in w)
    d = enc.encode(w, None, version=7)                    # nothing changed: nothing but the head
    assert delta_bytes(d.tensors) == 0 and int(d.tensors[HEAD][1]) == 0


def test_a_tensor_mostly_changed_goes_whole_and_a_cast_is_compared_in_the_wire_dtype():
    w = {"x": torch.ones(100)}
    enc = Encoder()
    mine = {k: v.to(torch.bfloat16) for k, v in enc.encode(w, torch.bfloat16, 1).tensors.items()}
    w["x"][10:] += 0.5                                    # 90% changed: the whole tensor beats positions + values
    d = enc.encode(w, torch.bfloat16, 2)
    assert "x::all" in d.tensors and "x::idx" not in d.tensors
    apply(d.tensors, mine, 1)
    assert torch.equal(mine["x"], w["x"].to(torch.bfloat16))
    w["x"] += 1e-4                                        # below bf16's resolution at 1 and 1.5: rounds away
    assert delta_bytes(enc.encode(w, torch.bfloat16, 3).tensors) == 0


def special(n: int, seed: int) -> torch.Tensor:
    """float32 values that test a bf16 cast: ties, NaNs of both signs, infinities, signed zeros, subnormals,
    values that round up to infinity."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=g) * torch.logspace(-40, 38, n).flip(0)[torch.randperm(n, generator=g)]
    ties = (torch.randint(-2**15, 2**15, (n // 8,), generator=g, dtype=torch.int32) << 16) | 0x8000
    x[: n // 8] = ties.view(torch.float32)
    x[n // 8: n // 8 + 8] = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), 0.0, -0.0,
                                          3.4e38, -1e-45])
    return x


@pytest.mark.parametrize("master, wire", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.bfloat16),
                                          (torch.float32, torch.float32)])
def test_the_one_pass_cpu_diff_gives_the_torch_paths_delta_bit_for_bit(monkeypatch, master, wire):
    from omnigraph.transports import delta_cpu
    assert delta_cpu.fits(torch.zeros(1, dtype=master), torch.zeros(1, dtype=wire))        # numba is here
    w = {"x": special(4096, 0).to(master), "y": torch.randn(300, 7).to(master), "z": torch.zeros(5, dtype=master)}
    fast, slow = Encoder(), Encoder()
    sent = []
    for v, frac in enumerate([0.0, 0.03, 0.2, 0.0, 0.9], start=1):
        if frac:
            g = torch.Generator().manual_seed(v)
            for t in w.values():
                m = torch.rand(t.shape, generator=g) < frac
                t[m] = (special(int(m.sum()), v).to(master) if t.numel() > 1000 else t[m] + 1)
        a = fast.encode(w, wire, v)
        with monkeypatch.context() as mp:
            mp.setattr(delta_cpu, "fits", lambda *_: False)
            b = slow.encode(w, wire, v)
        assert a.tensors.keys() == b.tensors.keys(), v
        for k in a.tensors:
            assert a.tensors[k].dtype == b.tensors[k].dtype and torch.equal(
                a.tensors[k].reshape(-1).view(torch.uint8), b.tensors[k].reshape(-1).view(torch.uint8)), (v, k)
        sent.append({k: t.clone() for k, t in a.tensors.items()})       # as a transport copies it
    assert "x::all" in sent[-1] and "y::idx" in sent[1]          # both a whole tensor and positions
    # the receiver's one pass writes what the torch path writes, and checks the same checksums
    mine, theirs = ({k: t.clone() for k, t in sent[0].items()} for _ in range(2))
    for v, d in enumerate(sent[1:], start=1):
        apply(d, mine, v)
        with monkeypatch.context() as mp:
            mp.setattr(delta_cpu, "fits", lambda *_: False)
            apply(d, theirs, v)
    assert all(torch.equal(mine[k].view(torch.uint8), theirs[k].view(torch.uint8)) for k in mine)
    assert all(torch.equal(mine[k].view(torch.uint8), w[k].to(wire).view(torch.uint8)) for k in mine)


@pytest.mark.parametrize("damage, words", [
    ("version", "version 1 reached a generator holding version 0"),
    ("value", "checksum"),
    ("dtype", "float32"),
    ("names", "not among them"),
])
def test_a_receiver_that_does_not_hold_the_base_refuses_and_writes_nothing(damage, words):
    w, enc = weights(), Encoder()
    mine = {k: v.clone() for k, v in enc.encode(w, None, 1).tensors.items()}
    step(w, 0.1, 2)
    d = enc.encode(w, None, 2)
    held = 1
    if damage == "version":
        held = 0
    elif damage == "value":
        pos = int(d.tensors["b::idx"][0])
        mine["b"][pos] += 1.0
    elif damage == "dtype":
        mine["a"] = mine["a"].float()
    else:
        mine["c"] = mine.pop("b")
    before = {k: v.clone() for k, v in mine.items()}
    with pytest.raises(DeltaMismatch, match=words):
        apply(d.tensors, mine, held)
    assert all(torch.equal(before[k], mine[k]) for k in mine)


def test_a_delta_run_trains_exactly_as_a_full_one(tmp_path):
    """float32 weights rebuilt from deltas are the same bits: the local executor's run is step for step the
    same as with payload full; the first sync is dense, the later ones say how many bytes a dense one is."""
    runs = {}
    for payload in ("full", "delta"):
        plan = og.compile(GRAPH, overrides=["schedule.iterations=6", "runtime.executor=local",
                                            f"nodes.sync.payload={payload}"])
        runs[payload] = run(plan, run_dir=tmp_path / payload, progress=False)
    rows = {p: [json.loads(x) for x in (r.run_dir / "metrics.jsonl").read_text().splitlines()]
            for p, r in runs.items()}
    assert [r.get("reward_mean") for r in rows["full"]] == [r.get("reward_mean") for r in rows["delta"]]
    syncs = [r for r in rows["delta"] if "sync_dense_bytes" in r]
    assert syncs[0]["sync_bytes"] == syncs[0]["sync_dense_bytes"] and len(syncs) >= 4


@pytest.mark.parametrize("graph, payload, words", [
    ("grpo_one_step_off.yaml", ["nodes.update.lora.r=8"], "LoRA"),
    ("smollm2_vllm_one_step_off.yaml", ["nodes.update.lora=null"], "fused"),
])
def test_delta_is_refused_where_it_cannot_apply(capsys, graph, payload, words):
    capsys.readouterr()
    assert main(["check", str(GRAPHS / graph), "nodes.sync.payload=delta", *payload]) == 1
    err = capsys.readouterr().err
    assert "nodes.sync.payload" in err and words in err and "Traceback" not in err


@pytest.mark.slow
def test_a_corrupted_rollout_is_caught_by_the_checksum_and_reseeded_densely(tmp_path, monkeypatch):
    """On Ray (shm path), bf16 weights and a small step (so positions travel, not whole tensors): one of the
    rollout's weights is changed before the delta of step 4 is applied; the checksum catches it, the
    supervisor restarts from the checkpoint of step 3, the new sender's first export is dense, and the run
    finishes every step."""
    monkeypatch.setenv("OMNIGRAPH_INJECT", "generate@4/delta:corrupt")
    plan = og.compile(GRAPH, overrides=["schedule.iterations=8", "runtime.executor=ray", "nodes.sync.payload=delta",
                                        "model.dtype=bfloat16", "nodes.update.lr=1e-6", "checkpoint.every=2",
                                        "runtime.max_restarts=1"])
    assert plan.weights == {"sync": "shm"}
    result = run(plan, run_dir=tmp_path, progress=False)
    events = [json.loads(x) for x in (result.run_dir / "restarts.jsonl").read_text().splitlines()]
    (restart,) = [e for e in events if e["event"] == "restart"]
    assert restart["node"] == "generate" and "checksum" in restart["cause"], restart
    rows = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    syncs = [r for r in rows if r.get("sync_dense_bytes")]
    dense = [r["step"] for r in syncs if r["sync_bytes"] == r["sync_dense_bytes"]]
    assert len(dense) == 2 and dense[0] == 1, dense     # the first export of each attempt, and no other
    assert all(r["sync_bytes"] < 0.3 * r["sync_dense_bytes"] for r in syncs if r["step"] not in dense)
    assert rows[-1]["step"] == plan.steps - 1 and not result.summary.get("groups_lost")


DELTA_WORKER = r"""
import json, pickle, sys, torch
from omnigraph.transports import groups, nccl
from omnigraph.transports.delta import HEAD, Encoder, apply, bits
rank, port = int(sys.argv[1]), int(sys.argv[2])
g = groups.join("d", "127.0.0.1", port, rank, 2, backend="gloo")
gen = torch.Generator().manual_seed(0)
w = {"a": torch.randn(300, 70, generator=gen).to(torch.bfloat16), "b": torch.randn(1000, generator=gen)}
def digest(t):
    return {k: int(bits(v).sum()) for k, v in t.items()}
if rank == 0:
    enc, sizes = Encoder(), []
    for v in range(1, 5):
        if v > 1:                                   # about 3% of the values change between versions
            for t in w.values():
                mask = torch.rand(t.shape, generator=gen) < 0.03
                t[mask] = (t[mask].float() + 0.5).to(t.dtype)
        st = enc.encode(w, torch.bfloat16, version=v)
        meta = nccl.describe(st.tensors, g.name, dtype=torch.bfloat16, bucket_bytes=4096)   # a layout per export
        g.store.set(f"meta{v}", pickle.dumps((st.payload, meta)))
        nccl.send(meta, st.tensors, g)
        sizes.append([st.payload, meta.nbytes])
    g.store.wait(["done"])
    for x in g.inflight.values():
        x.wait()
    print(json.dumps({"sizes": sizes, "digest": digest({k: v.to(torch.bfloat16) for k, v in w.items()})}))
else:
    mine, held = None, 0
    for v in range(1, 5):
        payload, meta = pickle.loads(g.store.get(f"meta{v}"))
        got = nccl.fetch(meta, g)
        if payload == "full":
            mine = {k: t.clone() for k, t in got.items() if k in ("a", "b")}
        else:
            apply(got, mine, held)                  # checks the base and the checksums, then writes in place
        held = v
    g.store.set("done", "1")
    print(json.dumps({"digest": digest(mine)}))
sys.stdout.flush()
__import__("os")._exit(0)                           # no gloo teardown at exit (see test_weightsync)
"""


def test_deltas_travel_over_a_process_group_and_rebuild_the_sender_bit_for_bit():
    """The group path (``nccl`` on GPUs; gloo here, the same code) carries a delta: a new description per
    export, positions and values broadcast, applied and checked on the receiving process."""
    import subprocess
    import sys

    import torch.distributed as dist
    root = ROOT
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", DELTA_WORKER, str(r), str(store.port)], cwd=root, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=180) for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(err[-3000:] for _, err in outs)
    sender, receiver = (json.loads([x for x in out.splitlines() if x.startswith("{")][-1]) for out, _ in outs)
    payloads, nbytes = zip(*sender["sizes"])
    assert payloads == ("full", "delta", "delta", "delta") and max(nbytes[1:]) < 0.3 * nbytes[0]
    assert receiver["digest"] == sender["digest"]


@pytest.mark.slow
def test_deltas_between_two_nodes_rebuild_the_trainers_wire_weights_bit_for_bit():
    import sys

    from nodes import zoo
    from omnigraph.cluster import LocalCluster

    sys.path.insert(0, str(ROOT / "bench"))
    import cross_sync
    with LocalCluster() as c:
        c.add_node("a", cpus=1)
        c.add_node("b", cpus=1)
        r = cross_sync.measure(c.address, str(zoo.tiny(0)), steps=2, lr=1e-4)
    assert r["receivers_bit_identical"] and 0 < r["cross_delta_bytes_fraction"] < 1
    assert r["cross_full_sync_s"] > 0 and r["cross_delta_sync_s"] > 0
