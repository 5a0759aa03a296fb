"""Where a Ray executor's actors go: each pool's node labels, and each actor's cores on a local cluster."""

from __future__ import annotations

import os

import ray


def fmt_labels(labels: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in labels.items())


def unlabelled(labels: dict[str, dict[str, str]]) -> list[str]:
    """The pools whose labels no live node carries."""
    if not labels:
        return []
    nodes = [n.get("Labels") or {} for n in ray.nodes() if n.get("Alive")]
    return [name for name, want in labels.items() if not any(all(have.get(k) == v for k, v in want.items())
                                                             for have in nodes)]


def core_layout(plan, spec) -> dict[str, list[int]]:
    """Cores for each actor on a local cluster: ``cpus`` whole cores each, in plan order, when the
    actors together fit the cores this process may use; otherwise none (no pinning)."""
    if spec.runtime.address:
        return {}
    free = physical_first(sorted(os.sched_getaffinity(0)))
    want = {name: int(a.cpus) for name, a in plan.actors.items()}
    if any(n < 1 or n != plan.actors[name].cpus for name, n in want.items()) or sum(want.values()) > len(free):
        return {}
    out, i = {}, 0
    for name, n in want.items():
        out[name], i = free[i:i + n], i + n
    return out


def physical_first(cpus: list[int]) -> list[int]:
    """One hardware thread of every physical core first, then their siblings: two busy actors pinned
    to hyperthread siblings share one core's execution units and slow each other down (e.g. a rollout's
    launch-bound generate beside the trainer)."""
    seen: set[str] = set()
    first, rest = [], []
    for c in cpus:
        try:
            with open(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list") as f:
                core = f.read().strip()
        except OSError:
            core = str(c)
        (rest if core in seen else first).append(c)
        seen.add(core)
    return first + rest
