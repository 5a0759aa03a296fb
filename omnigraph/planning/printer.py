"""``print(plan)``: every node, edge, delay, pool, task order, weights path, dtype and the staleness bound.

The one printer of a plan: ``omnigraph check`` and ``plan.txt`` in every run
directory are this text.
"""

from __future__ import annotations

from ..proof.schedule import Firing
from ..proof.staleness import hyperperiod
from .order import senders


def format_plan(plan) -> str:
    g, s = plan.graph, plan.graph.spec.schedule
    mode = s.mode + (f" (ahead {s.ahead})" if s.ahead else "")
    out = [f"plan {plan.name}: mode {mode}, sync_every {s.sync_every}, "
           f"{plan.iterations} iterations + {plan.fill} fill/drain = {plan.steps} steps"]
    out.append("nodes:")
    for n in g.nodes.values():
        rate = f", every {n.every}" if n.every > 1 else ""
        cost = f", cost {n.spec.cost:g}s" if getattr(n.spec, "cost", None) is not None else ""
        out.append(f"  {n.name:<14} {n.kind}[{n.backend}] on {n.pool} ({n.role}){rate}{cost}")
    out.append("edges:")
    for e in g.edges:
        out.append(f"  {e.arrow:<40} {e.type:<8} delay {e.delay}")
    joins = {}
    for e in g.edges:
        joins.setdefault((e.dst, e.dst_port), []).append(e.src)
    for (node, port), srcs in joins.items():
        if len(srcs) > 1 and plan.lend and plan.lend.get("lent_prompts") and any(x.endswith("_lent") for x in srcs):
            out.append(f"  join {node}.{port} <- {', '.join(srcs)}: shares of one step's prompt groups, "
                       "concatenated")
        elif len(srcs) > 1:
            out.append(f"  join {node}.{port} <- {', '.join(srcs)}: the same batch from each, fields merged, "
                       "the oldest version counts")
    out.append("actors (tasks in order; [-> actor]: its output leaves for that actor as the task ends):")
    sends = senders(plan)
    for name, a in plan.actors.items():
        res = f"cpus={a.cpus:g} gpus={a.gpus:g}"
        mine = sends.get(name, {})
        tasks = " -> ".join(t.label + (f" [-> {', '.join(mine[t.node])}]" if t.op == "run" and t.node in mine else "")
                            for t in plan.order[name]) or "(idle)"
        out.append(f"  {name:<12} {res:<16} {tasks}")
    out.append("channels:")
    for c in plan.channels:
        buf = f", buffer of {c.edge.delay} in {c.dst.actor}" if c.edge.delay else ""
        out.append(f"  {c.src.actor}:{c.edge.src}.{c.edge.src_port} -> {c.dst.actor}:{c.edge.dst}.{c.edge.dst_port}"
                   f"  {c.transport}{buf}")
    if plan.lend:
        out.append("lend:")
        out.append("  " + lend_line(plan.lend))
    if plan.weights:
        out.append("weights:")
        for node, path in plan.weights.items():
            out.append(f"  {node} -> {', '.join(e.dst for e in g.outputs_of(node) if e.state)}  by {path}")
    if plan.groups:
        out.append("process groups (formed before step 0):")
        for grp in plan.groups:
            out.append(f"  {grp.name}  {grp.backend} {grp.purpose}: {', '.join(grp.members)}")
    episodes = {n: o.env for n, o in g.spec.nodes.items() if getattr(o, "env", None) is not None}
    if episodes:
        out.append("episodes (multi-turn):")
        for n, env in episodes.items():
            out.append(f"  {n}: environment {env.name}, at most {env.max_turns} model turns of "
                       f"{g.spec.nodes[n].max_new_tokens} tokens, {env.max_tokens} tokens per episode, "
                       f"{env.waves} wave(s); only the model's tokens are trained; one weights version per episode")
    agents = {n: o.agent for n, o in g.spec.nodes.items() if getattr(o, "agent", None) is not None}
    if agents:
        out.append("agents (an OpenAI-compatible endpoint in the rollout):")
        for n, a in agents.items():
            program = a.entry if a.entry is not None else " ".join(a.command)
            out.append(f"  {n}: {program}, {a.concurrency} at once, at most {a.max_turns} requests of "
                       f"{g.spec.nodes[n].max_new_tokens} tokens and {a.max_tokens} tokens per episode, "
                       f"{a.timeout_s:g} s each (then on_timeout: {a.on_timeout}); endpoint on {a.host}; only the "
                       "sampled tokens are trained; one weights version per episode")
    partial = {n.name: n.spec.partial for n in g.of_role("generator") if n.spans > 1 or
               getattr(n.spec, "partial", None) is not None}
    if partial:
        st = plan.staleness
        whole = st.bound_whole if st.bound_whole is not None else st.bound
        out.append("partial rollouts (interruptible generation):")
        for n, p in partial.items():
            budget = f"{p.budget_tokens} new tokens" if p.budget_tokens else f"{p.budget_s:g} s"
            out.append(f"  {n}: at most {budget} per sample per firing; unfinished groups stay in {n} and continue "
                       f"on the next weights; a sample spans at most {p.max_spans} firings (in its last, and in the "
                       f"run's last firing, it runs to its end)")
        out.append(f"  bound per sample and per token: {st.bound} = {whole} without spans + {st.bound - whole} "
                   f"(a sample's oldest token is at most {max(p.max_spans for p in partial.values()) - 1} firings "
                   "older than its newest); checked on every token at the trainer")
    if g.data:
        out.append("data:")
        out.append("  " + data_line(g.data, g.spec))
    if plan.dtypes:
        out.append("dtype:")
        out.extend(f"  {p.line(pool)}" for pool, p in plan.dtypes.items())
    fill_nodes = _partial_steps(plan)
    out.append(f"fill: {fill_nodes[0]}")
    out.append(f"drain: {fill_nodes[1]}")
    st = plan.staleness
    out.append(f"staleness bound: {st.bound} (max_staleness {s.max_staleness}, on_stale {s.on_stale}; "
               f"{st.explanation}; unrolled {st.iterations_unrolled} iterations, hyperperiod {st.hyperperiod})")
    out.extend(correction_lines(plan))
    p = plan.prediction
    if p:
        out.append(f"predicted step: {p.step_s:.3f} s (serial sum {p.serial_s:.3f} s, overlap x{p.overlap:.2f})")
    out.append("warnings:" + ("" if plan.warnings else " none"))
    out.extend(f"  - {w}" for w in plan.warnings)
    return "\n".join(out)


def correction_lines(plan) -> list[str]:
    """How each trainer step corrects for the staleness the proof allows (its ``clip`` and ``is_cap``)."""
    out = []
    for n in plan.graph.of_role("trainer"):
        clip, cap = getattr(n.spec, "clip", None), getattr(n.spec, "is_cap", None)
        if clip is None or cap is None:
            continue
        weights = f"importance weights min(exp(old - behaviour), is_cap {cap:g})"
        if plan.bound == 0:
            out += [f"  {n.name}: on policy, PPO-clip {clip:g}; {weights}",
                    "    correct only the gap between the sampler's log-probs and the trainer's"]
        else:
            old = f"{plan.bound} version{'s' if plan.bound > 1 else ''}"
            out += [f"  {n.name}: decoupled PPO, PPO-clip {clip:g} against the proximal policy (the trainer's weights "
                    "at the step);", f"    {weights} for samples up to {old} old"]
    if out:
        out.append("  logged per step: behav_vs_old_logprob_absdiff_mean, behav_vs_old_logprob_maxdiff_max, is_mean, "
                   "is_max, is_trunc_frac, clip_frac")
    return ["correction:", *out] if out else []


def _partial_steps(plan) -> tuple[str, str]:
    """Describe the first ``fill`` and the last ``fill`` steps, where only part of the graph fires."""
    if plan.fill == 0:
        return "none (no delayed data edge)", "none"
    # the pattern of the first and last steps does not depend on the length of the run
    f = Firing(plan.graph, min(plan.iterations, 2 * plan.fill + hyperperiod(plan.graph)))
    fired = [sorted(f.next()) for _ in range(f.steps)]
    head = "; ".join(f"step {t}: {', '.join(x)}" for t, x in enumerate(fired[: plan.fill]))
    offset = plan.steps - f.steps
    tail = "; ".join(f"step {t + offset}: {', '.join(x)}" for t, x in list(enumerate(fired))[-plan.fill:])
    return head, tail


def data_line(d: dict, spec) -> str:
    """One line on prompts from data: where from, how many rows, what was left out, how far the run goes."""
    t = spec.task
    if d.get("rows") is None:           # an endless procedural source
        shots = f"; {d['fewshot']} solved example(s) before each question" if d.get("fewshot") else ""
        return (f"reasoning_gym {d['dataset']} {d.get('config') or ''} (seed {d['seed']}): endless, "
                f"{d['held_out']} questions held out; eval {d['eval_rows']} held-out questions{shots}")
    limit = d.get("limit") or {"tokens": t.max_prompt_tokens}
    longer = (f"longer than the model's context {limit['context']} - max_new_tokens {limit['max_new_tokens']} = "
              f"{limit['tokens']} tokens" if "context" in limit else f"> max_prompt_tokens {limit['tokens']}")

    def left_out(long: int, missing: int) -> str:
        return ((f", {long} left out ({longer})" if long else "")
                + (f", {missing} left out (no prompt or answer)" if missing else ""))
    used = spec.schedule.iterations * t.prompts / d["rows"]
    return (f"{d['rows']} rows from {d['source']} (split {t.split}{left_out(d['filtered'], d.get('missing', 0))})"
            f"; eval {d['eval_rows']} rows"
            + (f" (split {t.eval_split}{left_out(d.get('eval_filtered', 0), d.get('eval_missing', 0))})"
               if t.eval_split else "")
            + f"; {d['steps_per_epoch']:.2f} steps per epoch, {spec.schedule.iterations} iterations use "
              f"{used:.2f} epochs" + (f" of {t.epochs}" if t.epochs else ""))


def lend_line(info: dict) -> str:
    """``schedule.lend``'s decision in one line."""
    idle = f"trainer predicted idle {info['trainer_idle_s']:g} s a step ({info['idle_fraction']:.0%})"
    if not info["lent_prompts"]:
        return f"not lent ({info['mode']}): {info.get('reason', idle)}"
    k, p = info["lent_prompts"], info["prompts"]
    return (f"{info['generator']}_lent on {info['pool']} samples prompts {p - k}..{p - 1} of each step's {p} with "
            f"the weights of that step's update (staleness 0); {info['generator']} the other {p - k}; {idle}; the "
            f"trainer's pool x{info['speed']:g} the rollout's time per prompt ({info['speed_from']})")
