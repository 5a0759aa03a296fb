"""One trainer rank for bench/scale.py and tests/test_sharded.py:
``python bench/fsdp_rank.py RANK WORLD PORT OUT GRAPH MODE [lora] [key=value ...]``.

MODE ``single`` trains one unsharded actor on the rows in the order two ranks see them; ``fsdp`` trains rank
RANK of WORLD sharded ranks. Two batches, two optimizer steps each; then an export through the sync node, and
(sharded) a checkpoint of step 1 restored and step 2 trained again, which must give the same shards bit for bit.
"""

import os
import pickle
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import omnigraph as og  # noqa: E402
from omnigraph.sdk import SampleBatch, Weights  # noqa: E402
from omnigraph.testing import build_node, prompts  # noqa: E402
from omnigraph.transports import collectives, groups  # noqa: E402

rank, world, port, out, graph, mode = (int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4],
                                       sys.argv[5], sys.argv[6])
lora = "lora" in sys.argv[7:]
extra = [a for a in sys.argv[7:] if "=" in a]      # graph overrides, e.g. pools.trainer.gpus=1 on a GPU
torch.set_num_threads(1)
over = ["nodes.update.mini_batch_size=64", "nodes.update.micro_batch_size=8", f"pools.trainer.actors={world}", "runtime.executor=ray"]
if mode == "fsdp":
    over.append("pools.trainer.sharding=fsdp")
if lora:
    over += ["nodes.update.lora={r: 4, alpha: 8, target_modules: [q_proj, v_proj]}", "nodes.sync.payload=lora"]
spec = og.load(graph, over + extra)
gen, _ = build_node(spec, "generate")
batch = gen.generate(0, prompts(spec, 0), Weights(0))
batch = build_node(spec, "reward")[0].score(0, batch)
if world == 1:          # mini-batch i = rank 0's i-th 32 rows + rank 1's, as two ranks take them
    halves = [batch.shard(r, 2) for r in range(2)]
    batch = SampleBatch.concat([h.select(range(i * 32, (i + 1) * 32)) for i in range(2) for h in halves])
shared: dict = {}
upd, ctx = build_node(spec, "update", actor=f"trainer.{rank}", shared=shared)
sync, sctx = build_node(spec, "sync", actor=f"trainer.{rank}", shared=shared)
if mode == "fsdp":
    backend = "nccl" if ctx.device.startswith("cuda") else "gloo"
    g = groups.join("dp-trainer", "127.0.0.1", port, rank, world, 120.0, backend=backend, default=True)
    ctx.collectives = sctx.collectives = collectives.PoolCollectives(g)
mine = batch.shard(rank, world)
if world > 1 and rank == 1:     # a shorter share (samples dropped as stale): rank 1 keeps in step
    # with a micro-batch fewer in its second mini-batch (3 of 8 rows, not 4: an idle pass)
    mine = mine.select(range(len(mine) - 8))
elif world == 1:                  # the same rows: rank 1's last 8 are the reordered batch's last 8
    mine = batch.select(range(len(batch) - 8))
t0 = time.perf_counter()
upd.train(1, mine)
snap = pickle.loads(pickle.dumps(upd.state_dict()))      # a checkpoint as the interpreter writes it
upd.train(2, mine)
seconds = time.perf_counter() - t0
state = sync.state()
exact = None
if mode == "fsdp":
    after = {k: v.clone() for k, v in upd.state_dict()["model"].items()}
    upd.load_state_dict(snap)
    upd.train(2, mine)
    again = upd.state_dict()["model"]
    exact = all(torch.equal(after[k], again[k]) for k in after)
if rank == 0:
    torch.save({"weights": {k: v.float().cpu().clone() for k, v in state.tensors.items()}, "payload": state.payload,
                "mem_mb": ctx.metrics["trainer_state_mb"], "gpu_mem_gb": ctx.metrics.get("gpu_mem_gb"),
                "seconds": seconds, "exact": exact, "device": ctx.device}, out)
os._exit(0)      # no destructors: a gloo group torn down at interpreter exit aborts now and then
