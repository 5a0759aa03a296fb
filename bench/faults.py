"""Fault benchmark: faults in the middle of real work and kills from outside, each seen to fire and seen to
be recovered from.

Every fault runs in its own supervised run (``runtime.max_restarts=2``, checkpoints every 3 steps, the
``ray`` executor) and counts as

- *observed* only when ``restarts.jsonl`` records a restart whose cause names it (the injected fault's
  node, step and point, or the killed actor); for the damaged checkpoint, when the run reports it
  damaged and resumes from the previous one;
- *survived* only when it was observed and the ledger is intact: every generated prompt group trained
  exactly once, as many as an undisturbed run trains.

The faults:

- an exception raised as each node kind starts (synthetic graph: fast);
- inside the work, on the real tiny model: in generation's token loop, between the backward pass and the
  optimizer step (the process exits there), in the middle of a weight export (the process exits after
  packing, before the hand-over), inside the vLLM engine's sampler (when vLLM is installed);
- SIGKILL of a random actor's process at a random moment, from outside (not through the hook);
- the newest checkpoint damaged before ``--resume``.

Then exact resume (interrupted real training, resumed, compared bit for bit with an uninterrupted run)
on ``local`` and ``ray``; ``on_stale: wait`` on ``ray`` (async ahead 3, ``max_staleness`` 1); and
mutated YAML documents through ``omnigraph check --json`` under a per-document time limit.

    python bench/faults.py [--quick]

Prints a table, then one JSON line (last), and saves it under bench/results/ (``bench/record.py``).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.chdir(ROOT)
os.environ.setdefault("RAY_AUTH_MODE", "disabled")     # a local, loopback-only cluster

import psutil  # noqa: E402
import record  # noqa: E402

import omnigraph as og  # noqa: E402
from omnigraph.errors import NodeFailure  # noqa: E402
from omnigraph.records import read_jsonl  # noqa: E402
from omnigraph.runtime import run  # noqa: E402
from omnigraph.runtime.ledger import read  # noqa: E402

SYNTH = ROOT / "graphs" / "synthetic_one_step_off.yaml"
REAL = ROOT / "graphs" / "grpo_one_step_off.yaml"
BASE = ["checkpoint.every=3", "runtime.max_restarts=2"]
SYNTH_OVER = BASE + ["schedule.iterations=10", "nodes.generate.cost=0.05", "nodes.update.cost=0.05"]
REAL_OVER = BASE + ["schedule.iterations=24", "nodes.generate.eval_every=0"]


def supervised(graph: Path, overrides: list[str], out: Path, inject: str | None = None,
               kill: tuple[int, float] | None = None) -> dict:
    """One supervised run on ``ray``; ``inject``: OMNIGRAPH_INJECT; ``kill``: (seed, latest second) for a SIGKILL
    of a random actor at a random moment once the run has passed its first checkpoint."""
    killed: dict = {}
    stop = threading.Event()
    if inject:
        os.environ["OMNIGRAPH_INJECT"] = inject
    if kill:
        threading.Thread(target=_killer, args=(out, *kill, killed, stop), daemon=True).start()
    try:
        res = run(og.compile(graph, overrides=overrides), run_dir=out, executor="ray", progress=False)
        error = None
    except Exception as e:              # a restart that did not happen: the case failed, the bench goes on
        res, error = None, f"{type(e).__name__}: {e}"
    finally:
        os.environ.pop("OMNIGRAPH_INJECT", None)
        stop.set()
    (d,) = out.iterdir()
    return {"dir": d, "events": read_jsonl(d / "restarts.jsonl"), "ledger": read(d), "error": error,
            "killed": killed, "steps": res.steps if res else None}


def _killer(out: Path, seed: int, latest_s: float, killed: dict, stop: threading.Event) -> None:
    """Wait until the run has checkpointed once, then SIGKILL a random actor process after a random delay."""
    rng = random.Random(seed)
    while not stop.is_set():
        metrics = list(out.glob("*/metrics.jsonl"))
        if metrics and len(read_jsonl(metrics[0])) >= 4:
            break
        time.sleep(0.05)
    time.sleep(rng.uniform(0.0, latest_s))
    # the run's placement.jsonl says which process each actor of the current attempt is
    placed = [read_jsonl(f)[-1]["actors"] for f in out.glob("*/placement.jsonl")]
    actors = {name: a["pid"] for name, a in (placed[0] if placed else {}).items() if psutil.pid_exists(a["pid"])}
    if stop.is_set() or not actors:
        return
    name = rng.choice(sorted(actors))
    os.kill(actors[name], signal.SIGKILL)
    killed.update(actor=name, pid=actors[name], at=time.time())


def judged(r: dict, cause: str, expected_groups: int) -> dict:
    restarts = [e for e in r["events"] if e.get("event") == "restart"]
    observed = any(re.search(cause, e["cause"]) for e in restarts)
    s = r["ledger"]
    intact = s.ok and s.generated == s.trained_once == expected_groups
    return {"observed": observed, "survived": observed and intact and r["error"] is None, "restarts": len(restarts),
            "causes": [e["cause"][:120] for e in restarts], "generated": s.generated, "trained": s.trained_once,
            "lost": s.lost, "twice": len(s.trained_twice), "error": r["error"]}


def failed(error: BaseException) -> dict:
    """A case whose run ended in an error the supervisor did not recover from: reported, not survived."""
    return {"observed": False, "survived": False, "restarts": 0, "causes": [], "generated": 0, "trained": 0,
            "lost": 0, "twice": 0, "error": f"{type(error).__name__}: {error}"[:300]}


def attempt(label: str, fn, *args, default=None):
    """``fn(*args)``, or ``default`` with the error printed: one broken section does not lose the others."""
    try:
        return fn(*args)
    except Exception as e:
        print(f"  {label}: FAILED ({type(e).__name__}: {str(e)[:200]})", flush=True)
        return default


def corrupt_and_resume(out: Path, expected_groups: int) -> dict:
    os.environ["OMNIGRAPH_INJECT"] = "update@8:raise"
    try:
        run(og.compile(SYNTH, overrides=SYNTH_OVER + ["runtime.max_restarts=0"]), run_dir=out, executor="ray",
            progress=False)
    except NodeFailure:
        pass
    finally:
        os.environ.pop("OMNIGRAPH_INJECT", None)
    (d,) = out.iterdir()
    newest, previous = sorted((d / "checkpoints").iterdir())[-2:][::-1]
    victim = next(newest.glob("*.pkl"))
    victim.write_bytes(b"torn" + victim.read_bytes()[4:])
    run(og.compile(d / "config.yaml"), resume=d, executor="ray", progress=False)
    events = read_jsonl(d / "restarts.jsonl")
    reported = any(e.get("event") == "checkpoint_damaged" and e["checkpoint"] == newest.name for e in events)
    resumed = [e for e in events if e.get("event") == "resume"]
    skipped = reported and resumed and resumed[-1]["checkpoint"] == previous.name
    s = read(d)
    ok = s.ok and s.generated == s.trained_once == expected_groups
    return {"observed": bool(skipped), "survived": bool(skipped) and ok, "restarts": 0,
            "causes": [f"{newest.name} reported damaged, resumed from {previous.name}" if skipped else "not reported"],
            "generated": s.generated, "trained": s.trained_once, "lost": s.lost, "twice": len(s.trained_twice),
            "error": None}


def resume_bit_exact(tmp: Path, executor: str) -> bool:
    import torch
    from safetensors.torch import load_file
    over = ["schedule.iterations=8", "checkpoint.every=3", "nodes.generate.eval_every=0", f"runtime.executor={executor}"]
    plan = og.compile(REAL, overrides=over)
    a = run(plan, run_dir=tmp / "a", progress=False).run_dir
    os.environ["OMNIGRAPH_INJECT"] = "update@6:raise"
    try:
        run(plan, run_dir=tmp / "b", progress=False)
    except NodeFailure:
        pass
    finally:
        os.environ.pop("OMNIGRAPH_INJECT", None)
    (b,) = (tmp / "b").iterdir()
    run(og.compile(b / "config.yaml"), resume=b, progress=False)
    keys = ("reward_mean", "staleness_max", "version", "loss", "grad_norm", "entropy")
    rows = [[{k: r.get(k) for k in keys} for r in read_jsonl(d / "metrics.jsonl")] for d in (a, b)]
    wa, wb = (load_file(d / "final" / "model.safetensors") for d in (a, b))
    return rows[0] == rows[1] and all(torch.equal(wa[k], wb[k]) for k in wa)


def on_stale_wait(tmp: Path) -> tuple[int, int]:
    over = ["schedule.ahead=3", "schedule.max_staleness=1", "schedule.on_stale=wait", "schedule.iterations=8",
            "checkpoint.every=null"]
    res = run(og.compile(ROOT / "graphs" / "grpo_async.yaml", overrides=over), run_dir=tmp, executor="ray",
              progress=False)
    assert read(res.run_dir).ok
    return res.summary["observed_max_staleness"], res.summary["regenerated_samples"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer kills and fuzz cases")
    record.add_arguments(ap)
    args = ap.parse_args()
    import ray

    from fuzzcheck import fuzz
    ray.init(address="local", include_dashboard=False, logging_level="ERROR", configure_logging=False)
    synth_groups = 10 * 8
    real_groups = 24 * 16
    results: dict[str, dict] = {}
    kinds: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        try:
            n = 0

            def case(name, kind, graph, over, cause, groups, inject=None, kill=None):
                nonlocal n
                n += 1
                try:
                    r = supervised(graph, over, tmp / f"f{n}", inject=inject, kill=kill)
                    if kill:
                        actor = r["killed"].get("actor", "(none: the run ended first)")
                        name, cause = f"{name}: {actor}", rf"actor {re.escape(actor)} (died|is gone)"
                    results[name] = judged(r, cause, groups)
                except Exception as e:
                    name = f"{name} #{n}" if name in results else name
                    results[name] = failed(e)
                kinds[name] = kind
                r = results[name]
                print(f"  {name}: {'survived' if r['survived'] else 'NOT survived'}"
                      f"{'' if r['error'] is None else ' (' + r['error'][:200] + ')'}", flush=True)

            for node in ("generate", "reward", "old_logprob", "update", "sync"):
                case(f"raise as {node} starts", "start", SYNTH, SYNTH_OVER,
                     rf"node {node} failed at iteration 5: .*injected fault in {node} at step 5", synth_groups,
                     inject=f"{node}@5:raise")
            case("raise in generation's token loop (hf)", "mid", REAL, REAL_OVER,
                 r"node generate failed at iteration 7: .*injected fault in generate at step 7 \(token #3\)",
                 real_groups, inject="generate@7/token.3:raise")
            case("exit after backward, before the optimizer step", "mid", REAL, REAL_OVER,
                 r"node update failed at iteration 7: actor trainer\.0 died", real_groups,
                 inject="update@7/after_backward:exit")
            case("exit in the middle of a weight export (shm)", "mid", REAL, REAL_OVER,
                 r"node sync failed at iteration 7: actor trainer\.0 died", real_groups, inject="sync@7/export:exit")
            if importlib.util.find_spec("vllm") is not None:
                case("raise inside the vLLM engine's sampler", "mid", REAL, REAL_OVER + ["nodes.generate.backend=vllm"],
                     r"node generate failed at iteration 7: .*injected fault in generate at step 7 \(engine #3\)",
                     real_groups, inject="generate@7/engine.3:raise")
            for i in range(2 if args.quick else 6):
                case("SIGKILL from outside", "kill", REAL, REAL_OVER, "", real_groups, kill=(i, 1.5))
            try:
                results["damaged newest checkpoint"] = corrupt_and_resume(tmp / "corrupt", synth_groups)
            except Exception as e:
                results["damaged newest checkpoint"] = failed(e)
            kinds["damaged newest checkpoint"] = "checkpoint"
            max_stale, regenerated = attempt("on_stale wait", on_stale_wait, tmp / "wait", default=(None, None))
        finally:
            ray.shutdown()
        exact_local = attempt("exact resume on local", resume_bit_exact, tmp / "exact-local", "local")
        exact_ray = attempt("exact resume on ray", resume_bit_exact, tmp / "exact-ray", "ray")
        fz = attempt("fuzz", fuzz, 1000 if args.quick else 5000, tmp, 5.0,
                     default={"cases": 0, "tracebacks": None, "hangs": None})
    print(f"\n{'fault':<58} {'observed':>8} {'restarts':>8} {'generated':>9} {'trained':>7} {'lost':>5} "
          f"{'twice':>5}  survived")
    for name, r in results.items():
        print(f"{name:<58} {str(r['observed']):>8} {r['restarts']:>8} {r['generated']:>9} {r['trained']:>7} "
              f"{r['lost']:>5} {r['twice']:>5}  {'yes' if r['survived'] else 'NO'}")
        for c in r["causes"]:
            print(f"{'':<4}cause: {c}")
    print(f"exact resume (interrupted at step 6, resumed from step 5), bit for bit: local {exact_local}, ray {exact_ray}")
    print(f"on_stale wait (async ahead 3, max_staleness 1): observed max staleness {max_stale}, "
          f"{regenerated} samples regenerated")
    print(f"fuzz: {fz['cases']} mutated graphs through 'omnigraph check --json': {fz['tracebacks']} tracebacks, "
          f"{fz['hangs']} hangs")
    out = {"faults_injected": len(results), "faults_observed": sum(r["observed"] for r in results.values()),
           "faults_survived": sum(r["survived"] for r in results.values()),
           "mid_node_faults": sum(k == "mid" for k in kinds.values()),
           "external_kills": sum(k == "kill" for k in kinds.values()),
           "groups_lost": sum(r["lost"] for r in results.values()),
           "groups_trained_twice": sum(r["twice"] for r in results.values()),
           "resume_bit_exact_local": exact_local, "resume_bit_exact_ray": exact_ray,
           "on_stale_wait_max_staleness": max_stale, "on_stale_wait_regenerated_samples": regenerated,
           "fuzz_cases": fz["cases"], "fuzz_tracebacks": fz["tracebacks"], "fuzz_hangs": fz["hangs"],
           "faults": {name: {k: r[k] for k in ("observed", "survived", "restarts", "error")}
                      for name, r in results.items()}}
    record.emit("faults", out, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
