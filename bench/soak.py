"""Chaos soak: a long run of the one-step-off graph on ``ray`` while a seeded schedule throws faults at it,
compared bit for bit with the same run left alone; then a long fault-free run that watches memory.

1. **Reference**: ``omnigraph run graphs/grpo_one_step_off.yaml`` for ``--steps`` iterations on ``ray``
   (checkpoints every 5 steps), never disturbed.
2. **Soak**: the same command while a fault lands every ``--every`` steps or so, five kinds, each at least
   ``--per-kind`` times, on at least three node kinds:

   - ``raise``, ``hang``, ``exit`` inside a node (``OMNIGRAPH_INJECT`` with ``OMNIGRAPH_INJECT_ONCE``: each
     fires once, in the attempt that first reaches it);
   - an external ``SIGKILL`` of an actor's process (this script kills it, from outside the run);
   - ``SIGTERM`` to the ``omnigraph run`` process, then the same command again (a requeued job).

   A fault counts as *survived* only when it was seen to fire (a restart whose cause names it, or the
   preemption's exit 75 and the next command continuing the run) and the run ended with every prompt group
   trained exactly once. ``bit_exact``: the soak's metrics (every learning figure, every step) and final
   weights equal the reference's, bit for bit.
3. **NaN guard**: a short run with a NaN injected into one update's advantages: that update is skipped and
   counted, and the run goes on.
4. **Memory**: ``--memory-steps`` fault-free steps on ``ray``; the resident memory of the driver and of each
   actor's process, sampled as it runs. Growth after warm-up (the first fifth of the steps) is reported per
   1,000 steps for the process that grew most.

    python bench/soak.py [--quick] [--seed N]

Prints a table, then one JSON line (last), and saves it under bench/results/ (``bench/record.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXE = str(Path(sys.executable).with_name("omnigraph"))
GRAPH = ROOT / "graphs" / "grpo_one_step_off.yaml"
EXIT_PREEMPTED = 75
LEARNING = ("step", "reward_mean", "staleness_max", "version", "loss", "grad_norm", "entropy", "fired",
            "clip_frac", "ratio_mean", "kl")
"""The metrics compared bit for bit (timings differ run to run by nature)."""
NODES = ("generate", "reward", "old_logprob", "update", "sync")
IN_NODE = ("raise", "hang", "exit")
KINDS = IN_NODE + ("sigkill", "sigterm")
NAN_FAULT = "update@3/advantage:corrupt"
"""The NaN the guard must catch: one advantage of step 3's update set to NaN by the update itself."""


def schedule(steps: int, every: int, per_kind: int, seed: int) -> list[dict]:
    """The faults, in step order: ``per_kind`` of each kind, one every ``every`` steps (a seeded jitter of a
    few steps), the in-node ones spread over the node kinds."""
    rng = random.Random(seed)
    kinds = [k for k in KINDS for _ in range(per_kind)]
    rng.shuffle(kinds)
    if every // 2 + (len(kinds) - 1) * every + 2 >= steps - 3:      # the last fault a few steps before the end
        raise SystemExit(f"{len(kinds)} faults every {every} steps need more than {steps} steps (--steps)")
    nodes = list(NODES)
    rng.shuffle(nodes)
    out, i = [], 0
    for n, kind in enumerate(kinds):
        step = every // 2 + n * every + rng.randint(-2, 2)
        fault = {"kind": kind, "step": step}
        if kind in IN_NODE:
            fault["node"] = nodes[i % len(nodes)]
            i += 1
        out.append(fault)
    return out


def metrics_of(d: Path) -> list[dict]:
    return [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines() if x.strip()]


def _last_step(parent: Path) -> int:
    """The newest step written to the run's metrics (-1 before the first)."""
    for f in parent.glob("*/metrics.jsonl"):
        lines = [x for x in f.read_text().splitlines() if x.strip()]
        if lines:
            try:
                return json.loads(lines[-1])["step"]
            except (ValueError, KeyError):
                return -1
    return -1


def _actors(parent: Path) -> dict[str, int]:
    """The current attempt's actor processes (``placement.jsonl``'s newest record)."""
    for f in parent.glob("*/placement.jsonl"):
        lines = [x for x in f.read_text().splitlines() if x.strip()]
        if lines:
            return {name: a["pid"] for name, a in json.loads(lines[-1])["actors"].items()}
    return {}


class Job:
    """One ``omnigraph run`` process; ``external``: faults this script throws at it from outside, in order."""

    def __init__(self, args: list[str], parent: Path, env: dict, external: list[dict], rng: random.Random,
                 sample_rss: list | None = None):
        self.args, self.parent, self.env, self.external, self.rng = args, parent, env, external, rng
        self.sample_rss = sample_rss

    def run(self) -> tuple[int, str]:
        p = subprocess.Popen([EXE, "run", *self.args, "--run-dir", str(self.parent), "--quiet"], cwd=ROOT,
                             env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        err: list[str] = []
        reader = threading.Thread(target=lambda: err.append(p.stderr.read()), daemon=True)
        reader.start()
        while p.poll() is None:
            step = _last_step(self.parent)
            if self.external and step >= self.external[0]["step"]:
                self._throw(self.external[0], p, step)
            if self.sample_rss is not None:
                self._sample(p.pid, step)
            time.sleep(0.2 if self.sample_rss is None else 1.0)
        p.stdout.read()
        reader.join(timeout=30)
        return p.returncode, "".join(err)

    def _throw(self, fault: dict, p: subprocess.Popen, step: int) -> None:
        if fault["kind"] == "sigterm":
            p.send_signal(signal.SIGTERM)
            fault.update(fired=True, at_step=step)
            self.external.pop(0)
            return
        actors = {n: pid for n, pid in _actors(self.parent).items() if psutil.pid_exists(pid)}
        if not actors:             # between attempts: the next poll finds the new ones
            return
        name = self.rng.choice(sorted(actors))
        os.kill(actors[name], signal.SIGKILL)
        fault.update(fired=True, at_step=step, actor=name)
        self.external.pop(0)

    def _sample(self, driver: int, step: int) -> None:
        rss = {}
        for name, pid in [("driver", driver), *_actors(self.parent).items()]:
            try:
                rss[name] = psutil.Process(pid).memory_info().rss / 2 ** 20
            except psutil.Error:
                pass
        if step >= 0:
            self.sample_rss.append({"step": step, "t": time.time(), **rss})


def env_for(inject: str | None = None, once: Path | None = None) -> dict:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    for k in ("OMNIGRAPH_INJECT", "OMNIGRAPH_INJECT_ONCE", "OMNIGRAPH_ATTEMPT"):
        env.pop(k, None)
    if inject:
        env["OMNIGRAPH_INJECT"] = inject
        env["OMNIGRAPH_INJECT_ONCE"] = str(once)
    return env


def soak(tmp: Path, common: list[str], faults: list[dict], seed: int) -> dict:
    """The run under faults, requeued after each SIGTERM until it ends; what was seen of each fault."""
    inject = ", ".join(f"{f['node']}@{f['step']}:{f['kind']}" for f in faults if f["kind"] in IN_NODE)
    env = env_for(inject, tmp / "fired.txt")
    external = [f for f in faults if f["kind"] not in IN_NODE]
    parent = tmp / "soak"
    rng = random.Random(seed + 1)
    codes, errs = [], []
    while True:
        code, err = Job(common, parent, env, external, rng).run()
        codes.append(code)
        errs.append(err[-2000:])
        if code != EXIT_PREEMPTED or len(codes) > 20:
            break
    (d,) = parent.iterdir()
    events = [json.loads(x) for x in (d / "restarts.jsonl").read_text().splitlines()] \
        if (d / "restarts.jsonl").exists() else []
    return {"dir": d, "codes": codes, "events": events, "stderr": errs[-1]}


def observed(fault: dict, events: list[dict]) -> bool:
    """Whether the run's record shows this fault firing and the run going on past it."""
    restarts = [e for e in events if e.get("event") == "restart"]
    kind = fault["kind"]
    if kind == "raise":
        return any(f"injected fault in {fault['node']} at step {fault['step']}" in e["cause"] for e in restarts)
    if kind == "exit":
        return any(e["step"] == fault["step"] and ("died" in e["cause"] or "is gone" in e["cause"])
                   for e in restarts)
    if kind == "hang":
        return any(e["step"] == fault["step"] and "runtime.step_timeout_s" in e["cause"] for e in restarts)
    if kind == "sigkill":
        return fault.get("fired", False) and any(f"actor {fault['actor']} " in e["cause"] for e in restarts)
    return fault.get("fired", False) and any(e.get("event") == "preempted" for e in events)


def final_weights(d: Path) -> bytes:
    return (d / "final" / "model.safetensors").read_bytes()


def learning(rows: list[dict]) -> list[dict]:
    return [{k: r.get(k) for k in LEARNING} for r in rows]


def ledger(d: Path) -> dict:
    out = subprocess.run([EXE, "ledger", str(d), "--json"], capture_output=True, text=True, timeout=300)
    try:
        return json.loads(out.stdout)
    except ValueError:
        return {"ok": False, "error": (out.stdout + out.stderr)[-500:]}


def nan_guard(tmp: Path) -> dict:
    """A short run with a NaN in one update's advantages: skipped, counted, and the run finishes."""
    parent = tmp / "nan"
    env = {**env_for(), "OMNIGRAPH_INJECT": NAN_FAULT}
    out = subprocess.run([EXE, "run", str(GRAPH), "schedule.iterations=8", "nodes.generate.eval_every=0",
                          "--executor", "local", "--quiet", "--run-dir", str(parent)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    (d,) = parent.iterdir()
    rows = metrics_of(d)
    skipped = [r["step"] for r in rows if r.get("nonfinite_skipped")]
    return {"fired": out.returncode == 0 and skipped == [3], "skipped_steps": skipped, "code": out.returncode,
            "message": next((x for x in out.stderr.splitlines() if "non-finite" in x), None)}


def memory(tmp: Path, steps: int) -> dict:
    """A fault-free run of ``steps`` steps on ``ray``, its processes' resident memory sampled as it runs."""
    samples: list[dict] = []
    args = [str(GRAPH), f"schedule.iterations={steps}", "nodes.generate.eval_every=0", "checkpoint.every=100",
            "--executor", "ray"]
    code, err = Job(args, tmp / "memory", env_for(), [], random.Random(0), sample_rss=samples).run()
    warm = steps // 5
    growth = {}
    for name in sorted({k for s in samples for k in s} - {"step", "t"}):
        pts = [(s["step"], s[name]) for s in samples if name in s and s["step"] >= warm]
        if len(pts) < 4:
            continue
        k = max(2, len(pts) // 10)                  # a tenth of the samples at each end, their medians
        (s0, r0), (s1, r1) = _median(pts[:k]), _median(pts[-k:])
        growth[name] = {"start_mb": round(r0, 1), "end_mb": round(r1, 1),
                        "growth_mb_per_1000_steps": round((r1 - r0) / max(s1 - s0, 1) * 1000, 1)}
    return {"code": code, "error": err[-500:] if code else None, "steps": steps, "warmup_steps": warm,
            "samples": len(samples), "processes": growth}


def _median(pts: list[tuple[int, float]]) -> tuple[float, float]:
    xs, ys = sorted(p[0] for p in pts), sorted(p[1] for p in pts)
    return xs[len(xs) // 2], ys[len(ys) // 2]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the acceptance run: 300 steps, 3 faults of each kind")
    ap.add_argument("--steps", type=int, default=None, help="iterations of the soak (default 300; 600 without --quick)")
    ap.add_argument("--every", type=int, default=20, help="steps between faults")
    ap.add_argument("--per-kind", type=int, default=None, help="faults of each kind (default 3; 6 without --quick)")
    ap.add_argument("--memory-steps", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    record.add_arguments(ap)
    args = ap.parse_args()
    steps = args.steps or (300 if args.quick else 600)
    per_kind = args.per_kind or (3 if args.quick else 6)
    faults = schedule(steps, args.every, per_kind, args.seed)
    common = [str(GRAPH), f"schedule.iterations={steps}", "nodes.generate.eval_every=0", "checkpoint.every=5",
              "checkpoint.keep=2", "runtime.max_restarts=50", "runtime.step_timeout_s=15", "runtime.grace_s=120",
              "--executor", "ray"]
    t0 = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        print(f"reference: {steps} steps, undisturbed", flush=True)
        code, err = Job(common, tmp / "reference", env_for(), [], random.Random(0)).run()
        (ref,) = (tmp / "reference").iterdir()
        if code != 0:
            print(err[-3000:])
        print(f"soak: {len(faults)} faults: " + ", ".join(f"{f['kind']}@{f['step']}" + (f"({f['node']})" if
              "node" in f else "") for f in faults), flush=True)
        s = soak(tmp, common, faults, args.seed)
        if s["codes"][-1] != 0:
            print(s["stderr"])
        book = ledger(s["dir"])
        for f in faults:
            f["observed"] = observed(f, s["events"])
            f["survived"] = f["observed"] and s["codes"][-1] == 0 and bool(book.get("ok"))
        same_metrics = learning(metrics_of(s["dir"])) == learning(metrics_of(ref)) if code == 0 else False
        same_weights = s["codes"][-1] == 0 and code == 0 and final_weights(s["dir"]) == final_weights(ref)
        print("nan guard: a NaN in step 3's advantages", flush=True)
        nan = nan_guard(tmp)
        print(f"memory: {args.memory_steps} fault-free steps", flush=True)
        mem = memory(tmp, args.memory_steps)
    print(f"\n{'fault':<34} {'step':>5} {'observed':>8}  survived")
    for f in faults:
        what = f["kind"] + (f" in {f['node']}" if "node" in f else f" ({f['actor']})" if "actor" in f else "")
        print(f"{what:<34} {f['step']:>5} {str(f['observed']):>8}  {'yes' if f['survived'] else 'NO'}")
    restarts = sum(e.get("event") == "restart" for e in s["events"])
    print(f"soak: {restarts} restarts, {len(s['codes'])} commands (exit codes {s['codes']}); metrics bit for bit: "
          f"{same_metrics}, final weights: {same_weights}")
    print(f"nan guard: skipped steps {nan['skipped_steps']}: {nan['message']}")
    for name, g in mem["processes"].items():
        print(f"memory {name:<12} {g['start_mb']:>8.1f} MB -> {g['end_mb']:>8.1f} MB: "
              f"{g['growth_mb_per_1000_steps']:+.1f} MB per 1000 steps")
    worst = max((g["growth_mb_per_1000_steps"] for g in mem["processes"].values()), default=None)
    out = {"steps": steps, "faults_injected": len(faults), "faults_observed": sum(f["observed"] for f in faults),
           "faults_survived": sum(f["survived"] for f in faults),
           "kinds": {k: sum(f["kind"] == k for f in faults) for k in KINDS},
           "node_kinds": sorted({f["node"] for f in faults if "node" in f}),
           "restarts": restarts, "requeues": len(s["codes"]) - 1,
           "bit_exact": bool(same_metrics and same_weights), "metrics_bit_exact": same_metrics,
           "weights_bit_exact": same_weights,
           "groups_lost": book.get("lost", None), "groups_trained_twice": len(book.get("trained_twice", []) or []),
           "ledger_ok": book.get("ok"), "nan_guard_fired": nan["fired"], "nan_guard": nan,
           "memory_steps": mem["steps"], "rss_growth_mb_per_1000_steps": worst, "memory": mem,
           "faults": faults, "wall_s": round(time.time() - t0, 1)}
    record.emit("soak", out, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
