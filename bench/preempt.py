"""Preemption benchmark: SIGTERM into real training runs, the job run again unchanged, compared with a run
that was never stopped.

For each case (graph, executor), three ``omnigraph run`` processes, on the tiny model:

1. the job, never stopped (the reference);
2. the job, sent SIGTERM once it has written ``--after`` steps: measured are the seconds from the signal to
   the process's exit (the steps in flight finish, a checkpoint is written, the actors stop), its exit
   code (75 expected), the step its checkpoint holds, and the processes it left behind;
3. the same command again (a requeued job script): does it continue the run, and are its metrics, final
   weights and ledger those of the reference, bit for bit?

A preemption counts as survived only if the signal was seen to stop the run before its end (checkpoint
short of the last step) and the continued run matched.

    python bench/preempt.py [--quick]

Prints a table, then one JSON line (last), and saves it under bench/results/ (``bench/record.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import torch
from safetensors.torch import load_file

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
EXE = str(Path(sys.executable).with_name("omnigraph"))
KEYS = ("step", "reward_mean", "staleness_max", "version", "loss", "grad_norm", "fired")


def _lines(parent: Path) -> int:
    return max((p.read_text().count("\n") for p in parent.glob("*/metrics.jsonl")), default=0)


def job(args: list[str], parent: Path, after: int | None = None) -> dict:
    """One ``omnigraph run``; with ``after``, SIGTERM once ``after`` steps are written."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    p = subprocess.Popen([EXE, *args, "--run-dir", str(parent), "--quiet"], cwd=ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc, seen, sent = psutil.Process(p.pid), set(), None
    while p.poll() is None:
        try:
            seen |= {c.pid for c in proc.children(recursive=True)}
        except psutil.Error:
            pass
        if after is not None and sent is None and _lines(parent) >= after:
            p.send_signal(signal.SIGTERM)
            sent = time.monotonic()
        time.sleep(0.05)
    exit_s = time.monotonic() - sent if sent else None
    out, err = p.communicate()
    time.sleep(2)
    left = [q for q in seen if psutil.pid_exists(q) and psutil.Process(q).status() != "zombie"]
    return {"code": p.returncode, "out": out, "err": err, "signal_to_exit_s": exit_s, "left_behind": len(left)}


def _metrics(d: Path) -> list[dict]:
    return [{k: r.get(k) for k in KEYS} for r in map(json.loads, (d / "metrics.jsonl").read_text().splitlines())]


def _step_s(d: Path) -> float:
    rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
    times = sorted(r["step_s"] for r in rows[2:] if "step_s" in r) or [float("nan")]
    return times[len(times) // 2]


def case(graph: str, executor: str, iterations: int, after: int, tmp: Path) -> dict:
    args = ["run", str(ROOT / "graphs" / f"{graph}.yaml"), f"schedule.iterations={iterations}",
            "nodes.generate.eval_every=0", "--executor", executor]
    ref = job(args, tmp / "ref")
    (whole,) = (tmp / "ref").iterdir()
    stopped = job(args, tmp / "job", after=after)
    (d,) = (tmp / "job").iterdir()
    ckpts = sorted(p.name for p in (d / "checkpoints").glob("step-*"))
    again = job(args, tmp / "job")
    a, b = load_file(whole / "final" / "model.safetensors"), load_file(d / "final" / "model.safetensors")
    from omnigraph.runtime.ledger import read
    led = read(d)
    out = {"graph": graph, "executor": executor, "steps": iterations + 1, "signal_after_steps": after,
           "exit_code": stopped["code"], "signal_to_exit_s": round(stopped["signal_to_exit_s"], 3),
           "median_step_s": round(_step_s(whole), 3),
           "checkpoint_step": int(ckpts[-1].removeprefix("step-")) if ckpts else None,
           "left_behind": stopped["left_behind"], "requeue_continued": f"continuing {d}" in again["out"],
           "requeue_exit_code": again["code"], "metrics_equal": _metrics(d) == _metrics(whole),
           "weights_equal": a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a),
           "ledger_ok": bool(led.ok and led.generated == led.trained_once == read(whole).trained_once)}
    out["survived"] = bool(out["exit_code"] == 75 and out["checkpoint_step"] is not None
                           and out["checkpoint_step"] < iterations and out["requeue_continued"]
                           and out["metrics_equal"] and out["weights_equal"] and out["ledger_ok"]
                           and not out["left_behind"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="9 steps per run (else 24)")
    ap.add_argument("--after", type=int, default=3, help="steps written before the SIGTERM")
    record.add_arguments(ap)
    args = ap.parse_args()
    iterations = 9 if args.quick else 24
    cases = [("grpo_one_step_off", "local"), ("grpo_one_step_off", "ray"), ("grpo_async", "ray"),
             ("grpo_partial", "local")]
    rows = []
    for graph, executor in cases:
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(case(graph, executor, iterations, args.after, Path(tmp)))
        r = rows[-1]
        print(f"{graph:18s} {executor:6s} exit {r['exit_code']} in {r['signal_to_exit_s']:6.2f} s "
              f"(step {r['median_step_s']:.3f} s), checkpoint step {r['checkpoint_step']}, "
              f"left {r['left_behind']}, requeued: continued {r['requeue_continued']}, metrics "
              f"{r['metrics_equal']}, weights {r['weights_equal']}, ledger {r['ledger_ok']} -> "
              f"{'survived' if r['survived'] else 'NOT survived'}", flush=True)
    result = {"cases": rows, "survived": sum(r["survived"] for r in rows), "of": len(rows),
              "max_signal_to_exit_s": max(r["signal_to_exit_s"] for r in rows)}
    record.emit("preempt", result, args)
    return 0 if result["survived"] == result["of"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
