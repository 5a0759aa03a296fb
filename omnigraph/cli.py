"""The ``omnigraph`` command: thin commands over library functions.

    omnigraph run GRAPH.yaml [key=value ...]
    omnigraph check GRAPH.yaml [key=value ...] [--json]
    omnigraph viz GRAPH.yaml [-f mermaid|dot|ascii|png] [-o FILE] [--timeline]
    omnigraph ledger RUN_DIR [--json]
    omnigraph plan [GRAPH.yaml] --timings RUN_DIR [--json]
    omnigraph plan [GRAPH.yaml] --timings RUN_DIR [--timings RUN_DIR ...] --devices N [--write PATH]
    omnigraph plan [GRAPH.yaml] --timings RUN_DIR [...] --simulate [--sizes 8,...,1024] [--link GBPS,MS] [--delta F]

A mistake the user can make ends in one message and exit code 1, never a
traceback. ``main(argv)`` returns the exit code, for tests.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import viz
from .graph import yamlio
from .errors import GraphError, NodeFailure, StalenessError
from .planning import compile, layouts, simulate, to_spec, whatif
from .runtime import interrupt, run
from .runtime.ledger import format_summary, read
from .runtime.requeue import run_to_continue
from .runtime.rundir import config_of

USER_ERRORS = (GraphError, NodeFailure, StalenessError)


def local_cluster() -> dict[str, float]:
    """The CPUs and GPUs of this machine (what a local Ray cluster will have)."""
    gpus = 0
    if shutil.which("nvidia-smi"):
        try:
            listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
            gpus = sum(1 for line in listing.splitlines() if line.startswith("GPU "))
        except (OSError, subprocess.SubprocessError):
            gpus = 0
    return {"cpus": float(os.cpu_count() or 1), "gpus": float(gpus)}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="omnigraph", description="RL post-training as a static, compiled dataflow graph.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def graph_args(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("graph", help="graph YAML file")
        sp.add_argument("overrides", nargs="*", metavar="key.path=value", help="override fields, e.g. schedule.iterations=10")

    r = sub.add_parser("run", help="train: progress, metrics, plots")
    r.add_argument("graph", nargs="?", help="graph YAML file (not with --resume)")
    r.add_argument("overrides", nargs="*", metavar="key.path=value", help="override fields, e.g. schedule.iterations=10")
    r.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its newest good checkpoint")
    r.add_argument("--executor", choices=["ray", "local", "ray-tasks"], help="overrides runtime.executor")
    r.add_argument("--run-dir", help="parent folder of the run directory (runtime.run_dir), or a run directory: an "
                                     "unfinished run of the same graph and settings there is continued")
    r.add_argument("--fresh", action="store_true", help="start a new run even where an unfinished one could continue")
    r.add_argument("--address", help="join an existing Ray cluster (runtime.address)")
    r.add_argument("--quiet", action="store_true", help="no progress bar")

    c = sub.add_parser("check", help="validate: invariants, staleness bound, plan")
    graph_args(c)
    c.add_argument("--json", action="store_true", help="print one JSON object")

    v = sub.add_parser("viz", help="draw the graph or its pipeline timeline")
    graph_args(v)
    v.add_argument("-f", "--format", default="ascii", choices=["mermaid", "dot", "ascii", "png"])
    v.add_argument("-o", "--output", help="output file (required for png and --timeline)")
    v.add_argument("--timeline", action="store_true", help="draw the unrolled pipeline as a PNG Gantt chart")
    w = sub.add_parser("plan", help="predicted step time of each schedule, from a run's measured node times")
    w.add_argument("graph", nargs="?", help="graph YAML file (default: the run's config.yaml)")
    w.add_argument("overrides", nargs="*", metavar="key.path=value", help="override fields, e.g. pools.rollout.actors=2")
    w.add_argument("--timings", metavar="RUN_DIR", required=True, action="append",
                   help="a run directory whose node times to use; with --devices, once per run measured on other "
                        "pool sizes (fits each node's scaling)")
    w.add_argument("--devices", type=int, metavar="N", help="predict every split of N devices (colocated and "
                                                            "separate pools) under every schedule, and recommend one")
    w.add_argument("--write", metavar="PATH", help="with --devices: write the recommended layout as a graph file")
    w.add_argument("--simulate", action="store_true", help="on paper, 8 to 1,024 devices: the recommended layout of "
                                                           "each size from the fitted node times and a link model")
    w.add_argument("--sizes", metavar="N,N,...", help="with --simulate: the device counts (default 8,16,...,1024)")
    w.add_argument("--link", metavar="GBPS[,MS]", default="25,1",
                   help="with --simulate: the weights' link between separate pools (default 25 GB/s, 1 ms a sync)")
    w.add_argument("--delta", type=float, default=1.0, metavar="F",
                   help="with --simulate: the share of the weights' bytes a sync sends (default 1: dense)")
    w.add_argument("--weights-gb", type=float, metavar="GB",
                   help="with --simulate: the weights' size (default: the runs' median sync_bytes)")
    w.add_argument("--json", action="store_true", help="print one JSON object")
    g = sub.add_parser("ledger", help="where every prompt group of a run went")
    g.add_argument("run_dir", help="a run directory")
    g.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with a command's overrides and options in any order (``run GRAPH --run-dir DIR
    key=value`` as ``run GRAPH key=value --run-dir DIR``): a subcommand is parsed intermixed."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))   # noqa: SLF001 - argparse's own
    if argv and argv[0] in subs.choices:
        args = subs.choices[argv[0]].parse_intermixed_args(argv[1:])
        args.command = argv[0]
        return args
    return parser.parse_args(argv)                 # help, or the error naming the commands


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        return {"run": cmd_run, "check": cmd_check, "viz": cmd_viz, "ledger": cmd_ledger,
                "plan": cmd_plan}[args.command](args)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted: the graph was torn down and its actors stopped", file=sys.stderr)
        return 1


def _compile(args, extra: list[str] = (), cluster: dict[str, float] | None = None):
    return compile(args.graph, overrides=list(args.overrides) + list(extra), cluster=cluster)


def check_cluster() -> dict[str, float]:
    """What ``check`` holds the pools to: this machine's CPUs, and its GPUs only when it has some
    (a GPU graph is checked on a laptop; ``run`` still needs the GPUs)."""
    cluster = local_cluster()
    if not cluster["gpus"]:
        del cluster["gpus"]
    return cluster


def _gpu_note(plan) -> list[str]:
    want = sum(a.gpus for a in plan.actors.values())
    if want and local_cluster()["gpus"] < want:
        return [f"the pools ask for {want:g} GPU(s) and this machine has {local_cluster()['gpus']:g}: "
                "omnigraph run needs a machine with them"]
    return []


def cmd_check(args) -> int:
    if not args.json:
        plan = _compile(args, cluster=check_cluster())
        print(plan)
        for note in _gpu_note(plan):
            print(f"\nnote: {note}")
        print(f"\nvalid: staleness bound {plan.bound}")
        return 0
    report: dict[str, Any] = {"valid": False, "staleness_bound": None, "warnings": [], "errors": []}
    try:
        plan = _compile(args, cluster=check_cluster())
    except GraphError as e:
        report["errors"] = [str(x) for x in getattr(e, "errors", [e])]
    else:
        report.update(valid=True, staleness_bound=plan.bound, warnings=plan.warnings + _gpu_note(plan), name=plan.name,
                      mode=plan.graph.spec.schedule.mode, steps=plan.steps, fill=plan.fill,
                      predicted_step_s=round(plan.prediction.step_s, 6), weights=plan.weights,
                      actors={a: [t.label for t in ts] for a, ts in plan.order.items()})
    print(json.dumps(report))
    return 0 if report["valid"] else 1


def cmd_ledger(args) -> int:
    s = read(args.run_dir)
    print(json.dumps(s.as_dict()) if args.json else format_summary(s))
    return 0 if s.ok else 1


def cmd_plan(args) -> int:
    if not args.graph:
        args.graph = str(config_of(args.timings[0], "--timings"))
    spec = to_spec(args.graph, list(args.overrides))
    if args.simulate:
        if args.devices is not None or args.write:
            raise GraphError("--simulate picks a layout for each of --sizes; --devices and --write are for one size",
                             where="--simulate", fix="drop --devices/--write, or drop --simulate")
        link = simulate.Link.parse(args.link, args.delta)
        scaling, _ = layouts.fit_scaling(spec, args.timings)
        nbytes = args.weights_gb * 1e9 if args.weights_gb is not None else simulate.weights_bytes(args.timings)
        rows = simulate.simulate(spec, scaling, link, nbytes, simulate.parse_sizes(args.sizes))
        print(json.dumps(simulate.as_json(scaling, link, nbytes, rows)) if args.json
              else simulate.format_table(spec, scaling, link, nbytes, rows))
        return 0
    if args.devices is None:
        if len(args.timings) > 1 or args.write:
            raise GraphError("several --timings runs and --write go with --devices N", where="--devices",
                             fix="add --devices N (the devices to lay the graph out on)")
        timings, rows, info = whatif.compare(spec, args.timings[0])
        print(json.dumps(whatif.as_json(timings, rows, info)) if args.json
              else whatif.format_table(spec, args.timings[0], timings, rows, info))
        return 0
    scaling, runs = layouts.fit_scaling(spec, args.timings)
    rows = layouts.layouts(spec, scaling, args.devices, runs)
    pick = next((r for r in rows if r.recommended), None)
    if args.write and pick is not None:
        Path(args.write).write_text(f"# omnigraph plan --devices {args.devices}: {pick.layout}, {pick.schedule}, "
                                    f"predicted {pick.predicted_s:.3f} s/step\n"
                                    + yamlio.dump(layouts.chosen_spec(spec, pick)))
    print(json.dumps(layouts.as_json(scaling, runs, rows)) if args.json
          else layouts.format_table(spec, scaling, runs, rows, args.devices)
          + (f"\n  written: {args.write}" if args.write and pick is not None else ""))
    return 0 if pick is not None else 1


def cmd_viz(args) -> int:
    plan = _compile(args)
    if args.timeline or args.format == "png":
        if not args.output:
            raise GraphError("a PNG needs an output file", fix="add -o FILE.png")
        if args.timeline:
            viz.timeline(plan, args.output)
        else:
            viz.render(plan, "png", args.output)
        print(f"wrote {args.output}")
        return 0
    text = viz.render(plan, args.format)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text)
        print(f"wrote {args.output}")
    else:
        print(text, end="")
    return 0


def cmd_run(args) -> int:
    if args.resume:
        if args.graph or args.overrides:
            raise GraphError("--resume continues a run with its own config.yaml", where="--resume",
                             fix="drop the graph file and overrides (use --executor to change the executor)")
        args.graph = str(config_of(args.resume, "--resume"))
    elif not args.graph:
        raise GraphError("no graph given", fix="omnigraph run GRAPH.yaml, or omnigraph run --resume RUN_DIR")
    extra = []
    if args.executor:
        extra.append(f"runtime.executor={args.executor}")
    if args.address:
        extra.append(f"runtime.address={args.address}")
    if args.run_dir and not args.resume:
        extra.append(f"runtime.run_dir={args.run_dir}")
    cluster = None if args.address else local_cluster()
    plan = _compile(args, extra, cluster=cluster)
    if not args.resume and not args.fresh:
        found = run_to_continue(Path(args.run_dir or plan.graph.spec.runtime.run_dir), plan.graph.spec)
        if found is not None:           # a requeued job: continue the run instead of starting another
            print(f"continuing {found} (an unfinished run of this graph and settings; --fresh starts a new one)")
            args.resume, args.graph, args.overrides = str(found), str(found / "config.yaml"), []
            plan = _compile(args, [e for e in extra if not e.startswith("runtime.run_dir=")], cluster=cluster)
    for w in plan.warnings:
        print(f"warning: {w}", file=sys.stderr)
    if plan.weights:
        print("weights: " + "; ".join(f"{n} -> generators by {p}" for n, p in plan.weights.items()) + " (plan.txt)")
    rt = plan.graph.spec.runtime
    try:
        with interrupt.deferred(rt.preempt_signal, rt.grace_s):     # a signal: checkpoint and stop; twice: at once
            result = run(plan, progress=not args.quiet, resume=args.resume)
    except interrupt.Preempted as p:
        return _preempted(p)
    except interrupt.Stopped as s:
        kept = f"its newest checkpoint is {s.checkpoint}" if s.checkpoint else "it has no checkpoint (a resume starts over)"
        print(f"error: stopped at once: the graph was torn down and its actors stopped; {kept}\n"
              f"continue with: omnigraph run --resume {s.run_dir}", file=sys.stderr)
        return interrupt.EXIT_STOPPED
    from .viz.plots import plot_run         # matplotlib loads after the run, not before it
    s = result.summary
    s["plots"] = [str(p) for p in plot_run(result.run_dir)]
    reward = ""
    if s.get("reward_first") is not None:
        reward = f", reward {s['reward_first']:.3f} -> {s['reward_last']:.3f}"
    print(f"done: {s['steps']} steps in {s['wall_s']:.1f} s ({s['s_per_step']:.3f} s/step in steady state){reward}, "
          f"staleness max {s['observed_max_staleness']} (bound {s['staleness_bound']}), "
          f"prompt groups trained {s['groups_trained']}/{s['groups_generated']}")
    print(f"run directory: {result.run_dir}")
    if s.get("plots"):
        print("plots: " + ", ".join(os.path.basename(p) for p in s["plots"]) + " (in the run directory)")
    return 0


def _preempted(p) -> int:
    where = f"after step {p.step} ({p.step + 1} of {p.steps} done)" if p.step is not None else "before the first step"
    saved = f"checkpoint {p.checkpoint}" if p.checkpoint else "no checkpoint (the run starts over)"
    print(f"preempted ({p.signame}): stopped {where}; {saved} in {p.run_dir}\n"
          f"continue with: omnigraph run --resume {p.run_dir}  (or the same command again: it continues this run)",
          file=sys.stderr)
    return interrupt.EXIT_PREEMPTED


def entry() -> None:
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:                        # the reader went away (| head): nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = 0
    raise SystemExit(code)


if __name__ == "__main__":
    entry()
