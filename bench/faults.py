"""Fault benchmark: inject failures into real runs and check that no prompt group is lost or trained twice.

Faults (each in its own run of ``graphs/synthetic_one_step_off.yaml`` on the ``ray``
executor, with ``checkpoint.every=3`` and ``runtime.max_restarts=2``):

- an exception raised in each node kind (generate, reward, old_logprob, update, sync);
- the rollout actor's process killed mid-generation, the trainer's mid-update (``os._exit``);
- the newest checkpoint corrupted before a ``--resume``.

Each run's ledger must equal an undisturbed run's: every group trained exactly once.
Then an interrupted real training run (the tiny model, ``local`` executor) is resumed
and compared with an uninterrupted one (metrics and final weights, bit for bit), and
mutated YAML documents go through ``omnigraph check --json`` looking for tracebacks.

    python bench/faults.py [--quick]

Prints a table, then one JSON line (last).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.chdir(ROOT)
os.environ.setdefault("RAY_AUTH_MODE", "disabled")     # a local, loopback-only cluster

import omnigraph as og  # noqa: E402
from omnigraph.errors import NodeFailure  # noqa: E402
from omnigraph.ledger import read  # noqa: E402
from omnigraph.runtime import run  # noqa: E402

SYNTH = ROOT / "graphs" / "synthetic_one_step_off.yaml"
BASE = ["schedule.iterations=10", "checkpoint.every=3", "runtime.max_restarts=2", "nodes.generate.cost=0.05",
        "nodes.update.cost=0.05"]


def synth_run(out: Path, fault: str | None, extra=()) -> dict:
    if fault:
        os.environ["OMNIGRAPH_INJECT"] = fault
    try:
        res = run(og.compile(SYNTH, overrides=BASE + list(extra)), run_dir=out, executor="ray", progress=False)
    finally:
        os.environ.pop("OMNIGRAPH_INJECT", None)
    return {"ledger": read(res.run_dir), "restarts": len(res.summary["restarts"]), "dir": res.run_dir}


def corrupt_and_resume(out: Path) -> dict:
    os.environ["OMNIGRAPH_INJECT"] = "update@8:raise"
    try:
        run(og.compile(SYNTH, overrides=BASE[:2] + ["runtime.max_restarts=0"] + BASE[3:]), run_dir=out,
            executor="ray", progress=False)
    except NodeFailure:
        pass
    finally:
        os.environ.pop("OMNIGRAPH_INJECT", None)
    (d,) = out.iterdir()
    newest = sorted((d / "checkpoints").iterdir())[-1]
    victim = next(newest.glob("*.pkl"))
    victim.write_bytes(b"torn" + victim.read_bytes()[4:])
    run(og.compile(d / "config.yaml"), resume=d, executor="ray", progress=False)
    return {"ledger": read(d), "restarts": 1, "dir": d}


def resume_bit_exact(tmp: Path) -> bool:
    import torch
    from safetensors.torch import load_file
    over = ["schedule.iterations=8", "checkpoint.every=3", "nodes.generate.eval_every=0"]
    plan = og.compile(ROOT / "graphs" / "grpo_one_step_off.yaml", overrides=over)
    a = run(plan, run_dir=tmp / "a", executor="local", progress=False).run_dir
    os.environ["OMNIGRAPH_INJECT"] = "update@6:raise"
    try:
        run(plan, run_dir=tmp / "b", executor="local", progress=False)
    except NodeFailure:
        pass
    finally:
        os.environ.pop("OMNIGRAPH_INJECT", None)
    (b,) = (tmp / "b").iterdir()
    run(og.compile(b / "config.yaml"), resume=b, executor="local", progress=False)
    keys = ("reward_mean", "staleness_max", "version", "loss", "grad_norm", "entropy")
    rows = [[{k: r.get(k) for k in keys} for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())]
            for d in (a, b)]
    wa, wb = (load_file(d / "final" / "model.safetensors") for d in (a, b))
    return rows[0] == rows[1] and all(torch.equal(wa[k], wb[k]) for k in wa)


def fuzz(cases: int, tmp: Path) -> tuple[int, int]:
    """Mutated copies of the shipped graphs through ``omnigraph check --json``: count escaped exceptions."""
    from omnigraph.cli import main
    sources = [p.read_text() for p in (ROOT / "graphs").glob("*.yaml")]
    nasty = ["-1", "1e309", "99999999999999999999", "null", "[]", "{}", "'\u00e9\u2603'", "!!python/object:os.system",
             "&a [*a]", "true", "'a -> a'", "[[[[[[[[]]]]]]]]", "{delay: -1}", "\t"]
    rng = random.Random(0)
    tracebacks = 0
    path = tmp / "fuzz.yaml"
    for _ in range(cases):
        lines = rng.choice(sources).splitlines()
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(len(lines))
            op = rng.randrange(4)
            if op == 0:
                del lines[i]
            elif op == 1 and ":" in lines[i]:
                lines[i] = lines[i].split(":")[0] + ": " + rng.choice(nasty)
            elif op == 2:
                j = rng.randrange(len(lines[i]) + 1)
                lines[i] = lines[i][:j] + rng.choice("{}[]:-#\"é ") + lines[i][j:]
            else:
                lines.insert(i, lines[rng.randrange(len(lines))])
            lines = lines or [""]
        path.write_text("\n".join(lines))
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                main(["check", str(path), "--json"])
        except Exception:  # noqa: BLE001 - what we count
            tracebacks += 1
    return cases, tracebacks


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer fuzz cases")
    args = ap.parse_args()
    import ray
    ray.init(address="local", include_dashboard=False, logging_level="ERROR", configure_logging=False)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        try:
            ref = synth_run(tmp / "ref", None)["ledger"]
            faults = {f"raise in {n}": f"{n}@5:raise" for n in ("generate", "reward", "old_logprob", "update", "sync")}
            faults["kill rollout mid-generation"] = "generate@6:exit"
            faults["kill trainer mid-update"] = "update@6:exit"
            for i, (name, spec) in enumerate(faults.items()):
                try:
                    results[name] = synth_run(tmp / f"f{i}", spec)
                except NodeFailure as e:
                    results[name] = {"error": str(e)}
            results["corrupt newest checkpoint"] = corrupt_and_resume(tmp / "corrupt")
        finally:
            ray.shutdown()
        exact = resume_bit_exact(tmp / "exact")
        cases, tracebacks = fuzz(300 if args.quick else 3000, tmp)
    print(f"{'fault':<30} {'restarts':>8} {'generated':>9} {'trained once':>12} {'lost':>5} {'twice':>5}  survived")
    print(f"{'(undisturbed)':<30} {0:>8} {ref.generated:>9} {ref.trained_once:>12} {ref.lost:>5} "
          f"{len(ref.trained_twice):>5}")
    survived = lost = twice = 0
    for name, r in results.items():
        if "error" in r:
            print(f"{name:<30} failed: {r['error']}")
            continue
        s = r["ledger"]
        ok = s.ok and s.generated == ref.generated and s.trained_once == ref.trained_once
        survived += ok
        lost += s.lost
        twice += len(s.trained_twice)
        print(f"{name:<30} {r['restarts']:>8} {s.generated:>9} {s.trained_once:>12} {s.lost:>5} "
              f"{len(s.trained_twice):>5}  {'yes' if ok else 'NO'}")
    print(f"resume bit-exact (tiny model, interrupted at step 6, resumed from step 5): {exact}")
    print(f"fuzz: {cases} mutated graphs through 'omnigraph check --json', {tracebacks} tracebacks")
    print(json.dumps({"faults_injected": len(results), "faults_survived": survived, "groups_lost": lost,
                      "groups_trained_twice": twice, "resume_bit_exact": exact, "fuzz_cases": cases,
                      "fuzz_tracebacks": tracebacks}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
