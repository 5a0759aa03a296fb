"""Agent episodes across firings (``generate: {agent: ..., partial: {budget_tokens | budget_s, max_spans}}``):
an agent that is still talking to the policy when a firing's budget is spent goes on in the next firing, under
whatever weights arrived.

A firing opens the new prompts' episodes beside those carried in, and serves requests in batches as the
agent rollout does (:mod:`nodes.rollout.agents`), each request whole, by the firing's weights: each sampled
token keeps the version that sampled it and its log-prob. An episode's request that comes after it has had
``budget_tokens`` tokens in this firing, or after ``budget_s`` seconds, waits for the next firing. An episode in
its last allowed firing (``max_spans``), and every episode in the run's last firing, is served to its end, so
none spans more firings than the compiler's staleness proof assumes. The firing returns the prompt groups whose
episodes have all ended (GRPO normalises advantages within a group); the others stay, their agents waiting.

An agent's own state lives in its program and cannot be saved; a checkpoint keeps each episode in flight as
its trajectory and the answers it was given (:meth:`AgentEpisode.state_dict`). On resume the program runs
again from its task and the endpoint gives it those answers again, in order, without sampling: an agent that
acts on its answers alone (no clock, no randomness of its own) reaches the same request it was waiting on, and
the episode continues as if the run had not stopped. ``agent.timeout_s`` counts the episode's whole wall time,
the firings it waited through included.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from omnigraph.sdk import Prompt

from nodes.rollout.agent_broker import AgentEpisode, Call


class AgentSpans:
    """The episodes an agent rollout holds between firings, and one firing over them."""

    def __init__(self, agents, spec, iterations: int):
        self.agents, self.spec = agents, spec
        self.last = iterations - 1
        self.live: dict[int, list[AgentEpisode]] = {}
        self.held: list[Call] = []
        self.stats: dict[str, float] = {}
        self._sem = None

    def in_flight(self) -> list[int]:
        return sorted(self.live)

    def _start(self, eps: list[AgentEpisode]) -> None:
        a = self.agents
        if self._sem is None:                      # one semaphore for the run: agent.concurrency at once

            async def make():
                return asyncio.Semaphore(a.spec.concurrency)
            self._sem = asyncio.run_coroutine_threadsafe(make(), a.loop.loop).result()
        a.broker.open(eps, a.spec.concurrency, keep=True)
        asyncio.run_coroutine_threadsafe(a._all(eps, self._sem), a.loop.loop)

    def fire(self, step: int, prompts: list[Prompt], n: int, seed: int) -> list[AgentEpisode]:
        """Serve one firing; return the episodes of the groups that ended (in group order)."""
        a, spec = self.agents, self.spec
        carried = len(self.live)
        new = [AgentEpisode(p, uuid.uuid4().hex, i * n + j, step=step)
               for i, p in enumerate(prompts) for j in range(n)]
        for e in new:
            self.live.setdefault(e.prompt.group, []).append(e)
        eps = [e for g in self.live.values() for e in g]
        drain = step >= self.last
        for e in eps:
            e.fired, e.final = 0, drain or e.spans + 1 >= spec.max_spans
        a.errors = []
        self._start(new)
        held, self.held = self.held, []
        a.broker.release(held)
        deadline = None if spec.budget_s is None else time.perf_counter() + spec.budget_s
        t0, batches, served, rows_max = time.perf_counter(), 0, 0, 0
        while True:
            calls = a.broker.take(a.spec.batch_wait_s)
            over = deadline is not None and time.perf_counter() >= deadline
            now = [c for c in calls if c.episode.final or not (over or self._spent(c.episode))]
            later = [c for c in calls if c not in now]
            if later:
                self.held += later
                a.broker.hold(later)
            if now:
                rows = a._serve(now, False, (seed + 7919 * batches) % 2**31)
                batches, served, rows_max = batches + 1, served + len(now), max(rows_max, rows)
            elif self._ended(eps, over):
                break
        for e in eps:
            e.spans += 1
        ready = [g for g in sorted(self.live) if all(e.status != "running" for e in self.live[g])]
        done = [e for g in ready for e in self.live.pop(g)]
        a.broker.forget(done)
        a.stats = {"agent_requests": served, "agent_batches": batches, "agent_max_in_flight": rows_max,
                   "agent_s": time.perf_counter() - t0, "retokenize_mismatch": sum(e.mismatches for e in done),
                   "tool_calls_per_episode": sum(e.tool_calls for e in done) / max(len(done), 1),
                   "turns_mean": sum(e.requests for e in done) / max(len(done), 1),
                   "agent_timeouts": sum(e.status == "timeout" for e in done),
                   "agent_errors": sum(e.status == "error" for e in done),
                   "carried_groups_in": carried, "carried_groups_out": len(self.live), "finished_groups": len(ready),
                   "spans_mean": sum(e.spans for e in done) / max(len(done), 1),
                   "spans_max": max((e.spans for e in done), default=0)}
        return done

    def _spent(self, e: AgentEpisode) -> bool:
        return self.spec.budget_tokens is not None and e.fired >= self.spec.budget_tokens

    def _ended(self, eps: list[AgentEpisode], over: bool) -> bool:
        """The firing is over once no episode can be served more in it: each has ended, or waits for the next
        firing (its request held, or its budget spent), and none of those in their last firing runs."""
        waiting = {c.episode.eid for c in self.held}
        return all(e.status != "running" or (not e.final and (e.eid in waiting or over or self._spent(e)))
                   for e in eps)

    def state_dict(self) -> dict:
        return {"episodes": [e.state_dict() for g in sorted(self.live) for e in self.live[g]]}

    def load_state_dict(self, state: dict) -> None:
        eps = [AgentEpisode.from_state(s) for s in state.get("episodes", [])]
        self.live, self.held = {}, []
        for e in eps:
            self.live.setdefault(e.prompt.group, []).append(e)
        if eps:
            self._start(eps)
