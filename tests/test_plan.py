"""The plan: lowering, task order, printing, prediction."""

import omnigraph as og
from omnigraph.testing import canonical_spec

ONE_STEP_OFF = """\
plan canonical-one_step_off: mode one_step_off, sync_every 1, 8 iterations + 1 fill/drain = 9 steps
nodes:
  generate       generate[synthetic] on rollout (generator), cost 0.1s
  reward         reward[synthetic] on rollout (scorer), cost 0.1s
  old_logprob    old_logprob[synthetic] on trainer (logprob), cost 0.1s
  update         update[synthetic] on trainer (trainer), cost 0.1s
  sync           sync[synthetic] on trainer (exporter), cost 0.1s
edges:
  generate.rollout -> reward.rollout       Rollout  delay 0
  reward.batch -> old_logprob.batch        Batch    delay 1
  old_logprob.batch -> update.batch        Batch    delay 0
  update.weights -> sync.weights           Weights  delay 0
  sync.weights -> generate.weights         Weights  delay 1
actors (tasks in order; [-> actor]: its output leaves for that actor as the task ends):
  rollout.0    cpus=1 gpus=0    generate -> reward [-> trainer.0] -> apply sync->generate.weights
  trainer.0    cpus=1 gpus=0    old_logprob -> update -> export sync -> stash reward->old_logprob.batch
channels:
  rollout.0:generate.rollout -> rollout.0:reward.rollout  local
  rollout.0:reward.batch -> trainer.0:old_logprob.batch  shm, buffer of 1 in trainer.0
  trainer.0:old_logprob.batch -> trainer.0:update.batch  local
  trainer.0:update.weights -> trainer.0:sync.weights  local
  trainer.0:sync.weights -> rollout.0:generate.weights  channel, buffer of 1 in rollout.0
weights:
  sync -> generate  by channel
fill: step 0: generate, reward
drain: step 8: old_logprob, sync, update
staleness bound: 1 (max_staleness 1000, on_stale error; reward -> old_logprob delay 1; \
sync -> generate delay 1; unrolled 8 iterations, hyperperiod 1)
correction:
  update: decoupled PPO, PPO-clip 0.2 against the proximal policy (the trainer's weights at the step);
    importance weights min(exp(old - behaviour), is_cap 2) for samples up to 1 version old
  logged per step: behav_vs_old_logprob_absdiff_mean, behav_vs_old_logprob_maxdiff_max, is_mean, is_max, \
is_trunc_frac, clip_frac
predicted step: 0.300 s (serial sum 0.500 s, overlap x1.67)
warnings: none"""


def test_print_plan_is_pinned():
    assert str(og.compile(canonical_spec("one_step_off", cost=0.1, iterations=8))) == ONE_STEP_OFF


def test_compute_comes_before_stash_on_the_consumer_actor():
    plan = og.compile(canonical_spec("one_step_off"))
    labels = [t.label for t in plan.order["trainer.0"]]
    assert labels.index("old_logprob") < labels.index("stash reward->old_logprob.batch")
    assert [t.label for t in plan.order["rollout.0"]][-1] == "apply sync->generate.weights"


def test_sync_mode_has_no_stash_and_no_fill():
    plan = og.compile(canonical_spec("sync"))
    assert plan.fill == 0 and plan.steps == plan.iterations
    assert all(t.op == "run" for t in plan.order["trainer.0"])


def test_predicted_step_overlaps_only_on_separate_actors():
    sync = og.compile(canonical_spec("sync", cost=0.1)).prediction
    off = og.compile(canonical_spec("one_step_off", cost=0.1)).prediction
    colo = og.compile(canonical_spec("one_step_off", cost=0.1, colocate=True)).prediction
    assert abs(sync.step_s - 0.5) < 1e-9
    assert abs(off.step_s - 0.3) < 1e-9
    assert abs(colo.step_s - 0.5) < 1e-9


def test_measured_timings_replace_costs():
    plan = og.compile(canonical_spec("one_step_off", cost=0.1), timings={"generate": 1.0})
    assert abs(plan.prediction.step_s - 1.1) < 1e-9   # rollout-bound: generate 1.0 + reward 0.1


def test_data_parallel_ranks_are_aligned_within_a_pool():
    plan = og.compile(canonical_spec("one_step_off"), overrides=["pools.trainer.actors=2", "pools.rollout.actors=2"])
    pairs = {(c.src.actor, c.dst.actor) for c in plan.channels if c.edge.src == "old_logprob"}
    assert pairs == {("trainer.0", "trainer.0"), ("trainer.1", "trainer.1")}
    weights = [c for c in plan.channels if c.edge.dst == "generate"]
    assert {c.dst.actor for c in weights} == {"rollout.0", "rollout.1"} and {c.src.actor for c in weights} == {"trainer.0"}


def test_gpu_pools_send_batches_through_shared_memory():
    # batches are host tensors; weights take the plan's one weights path (tests/test_weightsync.py)
    plan = og.compile(canonical_spec("one_step_off"), overrides=["pools.trainer.gpus=1", "pools.rollout.gpus=1"])
    remote = [c for c in plan.channels if c.src.actor != c.dst.actor]
    assert {c.transport for c in remote if not c.edge.state} == {"shm"}
    assert {c.transport for c in remote if c.edge.state} == {plan.weights["sync"]} == {"channel"}   # one process
