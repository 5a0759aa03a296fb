"""Beyond one machine, measured side by side: the sharded trainer, a two-node Ray cluster, and three ways for tensors.

1. **FSDP2 vs one actor** (``bench/fsdp_rank.py``): the same GRPO batch of the tiny model, two optimizer steps
   of mini-batches of 64, first by one unsharded actor, then by two gloo ranks sharded with FSDP2 (rank 1 with
   8 rows fewer: an idle pass keeps it in step; the single actor drops the same rows). ``fsdp_max_abs_diff``:
   the largest difference of the exported weights; ``fsdp_mem_ratio``: parameters + gradients + AdamW
   moments held by one rank over the unsharded actor's (bytes of their storages); ``fsdp_exact_resume``:
   the step-1 checkpoint of the shards restored, step 2 again, bit for bit.
2. **A two-node cluster** (``omnigraph.cluster.LocalCluster``: ``ray start --head`` and ``ray start
   --address``, one CPU and one label each): ``omnigraph run --address`` with the rollout on node ``b`` and
   the trainer on node ``a`` (``pools.*.labels``), for both executors. ``cluster_nodes``: distinct nodes the
   actors ran on; ``cluster_run_ok``: both runs finished with no prompt group lost.
3. **Tensors between two actors**, the same 16 MB of float32 tensors (16 of them), five timed transfers
   after a warm-up each, in one Ray session: Ray Direct Transport over gloo from node ``a`` to node ``b``
   (``rdt_gb_s``), plain calls through the object store between the same nodes (``object_store_gb_s``),
   and a compiled graph's channel (``channel_gb_s``) between two actors on node ``a``: between the two
   nodes a compiled graph's compile or first execute did not return here (16 and 64 MB), so that row is
   on one node (``channel_same_node``). Each transfer ends when the receiver has read every tensor.

    python bench/scale.py [--quick]
    python bench/scale.py --gpu [--quick]     (on a CUDA machine: one FSDP2 rank over NCCL vs one actor on
                                              the GPU graph, then both trainers in a GPU run)

Human-readable lines, then one JSON line (last).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
GRAPH = ROOT / "graphs" / "grpo_one_step_off.yaml"
GPU_GRAPH = ROOT / "graphs" / "gpu" / "grpo_one_step_off.yaml"


def fsdp(tmp: Path, graph: Path = GRAPH, world: int = 2, extra: tuple[str, ...] = ()) -> dict:
    import torch
    import torch.distributed as dist

    def train(world: int, mode: str) -> dict:
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        out = tmp / f"{mode}-{world}.pt"
        procs = [subprocess.Popen([sys.executable, str(ROOT / "bench" / "fsdp_rank.py"), str(r), str(world),
                                   str(store.port), str(out), str(graph), mode, *extra], cwd=ROOT, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(world)]
        res = [p.communicate(timeout=600) for p in procs]
        if any(p.returncode for p in procs):
            raise RuntimeError("\n".join(err[-3000:] for _, err in res))
        return torch.load(out)

    one, two = train(1, "single"), train(world, "fsdp")
    diff = max(float((one["weights"][k] - two["weights"][k]).abs().max()) for k in one["weights"])
    print(f"fsdp: {world} rank(s) on {two['device']} vs 1 actor, max |diff| {diff:.2e}; state per rank "
          f"{two['mem_mb']:.2f} MB vs {one['mem_mb']:.2f} MB; exact resume {two['exact']}; {two['seconds']:.2f} s "
          f"vs {one['seconds']:.2f} s for the two updates", flush=True)
    out = {"fsdp_max_abs_diff": diff, "fsdp_mem_ratio": round(two["mem_mb"] / one["mem_mb"], 4),
           "fsdp_state_mb_rank": round(two["mem_mb"], 3), "fsdp_state_mb_single": round(one["mem_mb"], 3),
           "fsdp_exact_resume": two["exact"], "fsdp_update_s": round(two["seconds"] / 2, 4),
           "single_update_s": round(one["seconds"] / 2, 4), "fsdp_device": two["device"], "fsdp_world": world}
    if two.get("gpu_mem_gb") is not None:
        out |= {"fsdp_gpu_mem_gb": round(float(two["gpu_mem_gb"]), 3), "single_gpu_mem_gb": round(float(one["gpu_mem_gb"]), 3)}
    return out


def gpu_runs(tmp: Path, iterations: int) -> dict:
    """On one GPU: the GPU graph trained by one unsharded trainer and by a one-rank FSDP2 trainer (NCCL), the
    trainer holding the whole card (a sharded pool takes whole GPUs) and the rollout on CPU cores."""
    out = {}
    for mode in ("single", "fsdp"):
        run_dir = tmp / f"gpu-{mode}"
        over = ["pools.rollout.gpus=0", "pools.rollout.cpus=4", "pools.trainer.gpus=1", "pools.trainer.cpus=4",
                "runtime.executor=ray", f"schedule.iterations={iterations}", "checkpoint.every=10",
                f"runtime.run_dir={run_dir}"] + (["pools.trainer.sharding=fsdp"] if mode == "fsdp" else [])
        done = subprocess.run([sys.executable, "-m", "omnigraph.cli", "run", str(GPU_GRAPH), *over],
                              capture_output=True, text=True, timeout=900, cwd=ROOT)
        if done.returncode != 0:
            print(done.stdout[-3000:], done.stderr[-3000:])
            out[f"gpu_{mode}_run_ok"] = False
            continue
        (d,) = run_dir.iterdir()
        summary = json.loads((d / "summary.json").read_text())
        out |= {f"gpu_{mode}_run_ok": summary["groups_lost"] == 0, f"gpu_{mode}_s_per_step": summary["s_per_step"],
                f"gpu_{mode}_reward_first": round(summary["reward_first"], 4),
                f"gpu_{mode}_reward_last": round(summary["reward_last"], 4)}
        print(f"gpu run, trainer {mode}: {summary['s_per_step']} s/step, reward {summary['reward_first']:.3f} -> "
              f"{summary['reward_last']:.3f}, groups lost {summary['groups_lost']}", flush=True)
    return out


def cluster_runs(c, tmp: Path, iterations: int) -> dict:
    out = {}
    nodes = set()
    ok = True
    for executor in ("ray", "ray-tasks"):
        run_dir = tmp / executor
        t0 = time.perf_counter()
        done = subprocess.run([str(Path(sys.executable).with_name("omnigraph")), "run", str(GRAPH),
                               "pools.rollout.labels={omnigraph/node: b}", "pools.trainer.labels={omnigraph/node: a}",
                               f"schedule.iterations={iterations}", "nodes.generate.eval_every=0",
                               f"runtime.executor={executor}", f"runtime.run_dir={run_dir}", "--address", c.address],
                              capture_output=True, text=True, timeout=900)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            print(done.stdout[-2000:], done.stderr[-2000:])
            ok = False
            continue
        (d,) = run_dir.iterdir()
        summary = json.loads((d / "summary.json").read_text())
        placed = [json.loads(x) for x in (d / "placement.jsonl").read_text().splitlines()][0]["actors"]
        nodes |= {p["node_id"] for p in placed.values()}
        path = next(line.split(" by ")[1].split()[0] for line in (d / "plan.txt").read_text().splitlines()
                    if " by " in line and "->" in line)
        ok = ok and summary["groups_lost"] == 0
        key = executor.replace("-", "_")
        out[f"cluster_{key}_s_per_step"] = summary.get("s_per_step")
        out[f"cluster_{key}_weights_path"] = path
        print(f"cluster, {executor}: {summary.get('s_per_step')} s/step, weights by {path}, wall {wall:.1f} s, "
              f"groups lost {summary['groups_lost']}", flush=True)
    out.update(cluster_nodes=len(nodes), cluster_run_ok=ok)
    return out


def transfers(c, reps: int) -> dict:
    import ray
    import torch
    from ray.experimental.collective import create_collective_group

    ray.init(address=c.address, logging_level="ERROR", log_to_driver=False)
    try:
        class Peer:
            def __init__(self):
                torch.set_num_threads(1)
                self.t = {}

            def make(self, mb: int) -> int:
                n = mb * (1 << 20) // 4 // 16
                self.t = {f"w{i}": torch.randn(n) for i in range(16)}
                return sum(v.numel() * 4 for v in self.t.values())

            def send(self, _=None):
                return self.t

            def read(self, d) -> float:
                return sum(float(v[-1]) for v in d.values())          # touches every tensor

        class RdtPeer(Peer):
            @ray.method(tensor_transport="gloo")
            def send_rdt(self):
                return self.t

        Rdt = ray.remote(num_cpus=0, enable_tensor_transport=True)(RdtPeer)
        Plain = ray.remote(num_cpus=0)(Peer)
        a = Rdt.options(label_selector={"omnigraph/node": "a"}).remote()
        b = Rdt.options(label_selector={"omnigraph/node": "b"}).remote()
        nbytes = ray.get(a.make.remote(16))
        create_collective_group([a, b], backend="torch_gloo")

        def timed(fn) -> float:
            fn()
            best = float("inf")
            for _ in range(reps):
                t0 = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - t0)
            return nbytes / best / 1e9

        print("transfers: Ray Direct Transport ...", flush=True)
        rdt = timed(lambda: ray.get(b.read.remote(a.send_rdt.remote())))
        # the other two between plain actors (a compiled graph of RDT-enabled actors hung here); the RDT pair
        # goes first: its threads would take the cores
        ray.kill(a)
        ray.kill(b)
        a = Plain.options(label_selector={"omnigraph/node": "a"}).remote()
        b = Plain.options(label_selector={"omnigraph/node": "b"}).remote()
        assert ray.get(a.make.remote(16)) == nbytes
        print(f"  {rdt:.2f} GB/s; the object store ...", flush=True)
        store = timed(lambda: ray.get(b.read.remote(a.send.remote())))
        print(f"  {store:.2f} GB/s; a compiled graph's channel ...", flush=True)
        # a compiled graph's channel between the two nodes did not return here (compile or first execute
        # hung, 16 and 64 MB): measured between two actors on node a, in a thread that may not hold the bench
        ray.kill(b)
        b = Plain.options(label_selector={"omnigraph/node": "a"}).remote()
        ray.get(b.make.remote(0))
        box: dict = {}

        def channel_run():
            from ray.dag import InputNode
            with InputNode() as inp:
                dag = b.read.bind(a.send.bind(inp))
            compiled = dag.experimental_compile(_buffer_size_bytes=4 * nbytes)
            box["gb_s"] = timed(lambda: compiled.execute(0).get(timeout=60))
            compiled.teardown()
        import threading
        th = threading.Thread(target=channel_run, daemon=True)
        th.start()
        th.join(timeout=120)
        channel = box.get("gb_s")
        print(f"tensors, node a -> node b, {nbytes / 1e6:.0f} MB: RDT (gloo) {rdt:.2f} GB/s, compiled-graph channel "
              f"{channel if channel is None else round(channel, 2)} GB/s (two actors on node a), object store {store:.2f} GB/s",
              flush=True)
        return {"transfer_mb": round(nbytes / 1e6, 1), "rdt_gb_s": round(rdt, 3),
                "channel_gb_s": None if channel is None else round(channel, 3), "channel_same_node": True,
                "object_store_gb_s": round(store, 3)}
    finally:
        ray.shutdown()


def main() -> int:
    import tempfile

    import record
    from omnigraph.cluster import LocalCluster
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations and transfers")
    ap.add_argument("--gpu", action="store_true", help="on a CUDA machine: FSDP2 over NCCL, one rank, and GPU runs")
    record.add_arguments(ap)
    args = ap.parse_args()
    result: dict = {}
    if args.gpu:
        with tempfile.TemporaryDirectory(prefix="og-scale-") as tmp:
            result |= fsdp(Path(tmp), GPU_GRAPH, 1, ("pools.trainer.gpus=1",))
            result |= gpu_runs(Path(tmp), 20 if args.quick else 40)
        record.emit("scale_gpu", result, args)
        return 0
    with tempfile.TemporaryDirectory(prefix="og-scale-") as tmp:
        result |= fsdp(Path(tmp))
        with LocalCluster() as c:
            c.add_node("a", cpus=1)
            c.add_node("b", cpus=1)
            result |= cluster_runs(c, Path(tmp), 20 if args.quick else 60)
            result |= transfers(c, 3 if args.quick else 5)
    record.emit("scale", result, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
