"""What the agents' endpoint (:mod:`nodes.rollout.agent_server`) and the agent rollout
(:mod:`nodes.rollout.agents`) share: an episode's record, a queued request (:class:`Call`), the queue between
the endpoint's handlers and the rollout's thread (:class:`Broker`), and the OpenAI-shaped refusal
(:class:`AgentError`)."""

from __future__ import annotations

import concurrent.futures
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from omnigraph.sdk import Prompt

from nodes.models import vision


class AgentError(Exception):
    """A request the endpoint refuses: an OpenAI-shaped error (status, type, message, param)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.kind, self.param = status, kind, param


@dataclass
class AgentEpisode:
    prompt: Prompt
    eid: str
    index: int = 0                     # its place in the batch: a batch's requests are sampled in this order
    ids: list[int] | None = None       # the conversation's tokens so far (the first prompt, then the region)
    head: int = 0                      # tokens before the client's text (a plain prompt's bos)
    prompt_len: int = 0
    tokens: list[int] = field(default_factory=list)
    model: list[float] = field(default_factory=list)
    logprob: list[float] = field(default_factory=list)
    sampled: dict[str, str] = field(default_factory=dict)     # message_key -> the text sampled for it
    requests: int = 0
    tool_calls: int = 0
    mismatches: int = 0
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    status: str = "running"            # running, done, timeout, error
    truncated: bool = False
    last: str = ""
    segments: list[tuple] = field(default_factory=list)    # with on_divergence: split, the samples it closed
    versions: list[int] = field(default_factory=list)    # the weights version that sampled each token (-1: none)
    step: int = 0                      # the firing it began in
    spans: int = 0                     # firings it was decoded in (partial rollouts)
    fired: int = 0                     # tokens sampled for it in the current firing
    final: bool = False                # in its last allowed firing: served to its end
    log: list[dict] = field(default_factory=list)        # the answers it was given, in order (for a resume)
    replay: int = 0                    # after a resume: answers of the log still to give again
    pictures: list[bytes] = field(default_factory=list)  # the pictures in the sample's tokens, in order
    pixels: list = field(default_factory=list)           # their pixel inputs (nodes.models.vision), one each

    def add(self, tokens: list[int], trained: bool, logprobs: list[float] | None = None, version: int = -1) -> None:
        self.tokens += tokens
        self.ids = (self.ids or []) + tokens
        self.model += [1.0 if trained else 0.0] * len(tokens)
        self.logprob += logprobs if logprobs is not None else [0.0] * len(tokens)
        self.versions += [version if trained else -1] * len(tokens)

    def split(self, ids: list[int], pictures: list[bytes] = (), pixels: list = ()) -> None:
        """Close the sample so far (``on_divergence: split``) and start another from ``ids``, the prompt of the
        request that diverged (with its ``pictures`` and their ``pixels``)."""
        self.segments.append(self.samples()[-1])
        self.ids, self.prompt_len = list(ids), len(ids)
        self.tokens, self.model, self.logprob, self.versions = [], [], [], []
        self.pictures, self.pixels = list(pictures), list(pixels)

    def samples(self) -> list[tuple]:
        """``(prompt ids, tokens, trained flags, logprobs, last reply, versions, pixel values)`` of each sample of
        the episode, in order (pixel values: the pictures' as one, ``None`` without pictures)."""
        return [*self.segments,
                ((self.ids or [])[:self.prompt_len], self.tokens, self.model, self.logprob, self.last, self.versions,
                 self.pixel_values())]

    def pixel_values(self):
        """The pixel inputs of the sample's pictures as one (``None``: no pictures)."""
        return vision.concat(self.pixels) if self.pixels else None

    STATE = ("eid", "index", "ids", "head", "prompt_len", "tokens", "model", "logprob", "sampled", "requests",
             "tool_calls", "mismatches", "truncated", "last", "segments", "versions", "step", "spans", "log",
             "pictures", "pixels")

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of an episode in flight: its trajectory and the answers it was given (the
        agent's own state is its program's: on resume the program runs again, given those answers)."""
        return {"prompt": self.prompt, **{k: getattr(self, k) for k in self.STATE}}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "AgentEpisode":
        e = cls(state["prompt"], state["eid"])
        for k in cls.STATE:
            if k in state:               # (a checkpoint from before pictures has none)
                setattr(e, k, state[k])
        e.replay = len(e.log)
        return e

    def record(self) -> dict[str, Any]:
        return {"index": self.index, "reward": self.reward, "turns": self.requests, "tool_calls": self.tool_calls,
                "done": self.status == "done", "truncated": self.truncated, "status": self.status,
                "retokenize_mismatch": self.mismatches, "info": dict(self.info)}


@dataclass
class Call:
    """One request, queued for the rollout's thread."""

    episode: "AgentEpisode"
    kind: str                          # "chat" or "completion"
    body: dict[str, Any]
    n: int
    max_tokens: int | None
    stop: list[str]
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


class Broker:
    """The queue between the endpoint's handlers (any thread) and the rollout's thread."""

    def __init__(self):
        self.cond = threading.Condition()
        self.calls: list[Call] = []
        self.episodes: dict[str, AgentEpisode] = {}
        self.first_at: float | None = None
        self.unfinished, self.concurrency, self.blocked = 0, 1, 0

    @property
    def active(self) -> int:
        """The requests a full batch holds: one per agent running or about to (the episodes not finished,
        at most ``concurrency``: an agent waiting for a slot starts as soon as one ends), less those whose
        request waits for the next firing (partial rollouts)."""
        return min(self.unfinished, self.concurrency) - self.blocked

    def open(self, episodes: list[AgentEpisode], concurrency: int, keep: bool = False) -> None:
        """Serve ``episodes`` (``keep``: beside those already open, as partial rollouts carry them)."""
        with self.cond:
            if not keep:
                self.episodes, self.unfinished = {}, 0
            self.episodes.update({e.eid: e for e in episodes})
            self.unfinished += len(episodes)
            self.concurrency = concurrency

    def forget(self, episodes: list[AgentEpisode]) -> None:
        """Episodes that ended and left the rollout (partial rollouts keep the broker open across firings)."""
        with self.cond:
            for e in episodes:
                self.episodes.pop(e.eid, None)

    def hold(self, calls: list[Call]) -> None:
        """These requests wait for the next firing: a batch no longer waits for their agents."""
        with self.cond:
            self.blocked += len(calls)
            self.cond.notify_all()

    def release(self, calls: list[Call]) -> None:
        """Requests held from the last firing, queued again first."""
        with self.cond:
            self.blocked -= len(calls)
            self.calls = list(calls) + self.calls
            if self.calls and self.first_at is None:
                self.first_at = time.perf_counter()
            self.cond.notify_all()

    def episode(self, eid: str) -> AgentEpisode:
        e = self.episodes.get(eid)
        if e is None or e.status != "running":
            raise AgentError(404, f"no running episode '{eid[:40]}' at this endpoint (its agent run ended, or the "
                                  "base URL is not the one it was given)", "not_found_error")
        return e

    def leave(self) -> None:
        """An agent finished: a batch no longer waits for its request."""
        with self.cond:
            self.unfinished -= 1
            self.cond.notify_all()

    def submit(self, call: Call, limit: int) -> concurrent.futures.Future:
        with self.cond:
            if len(self.calls) >= limit:
                raise AgentError(429, f"more than {limit} requests are waiting; retry later", "rate_limit_error")
            self.calls.append(call)
            if self.first_at is None:
                self.first_at = time.perf_counter()
            self.cond.notify_all()
        return call.future

    def take(self, wait_s: float, poll_s: float = 0.01) -> list[Call]:
        """The queued calls, once every running agent has one queued (:attr:`active`, counted down as they
        finish, so an agent that just got its last reply is not waited for) or ``wait_s`` passed since the first;
        [] after ``poll_s`` with none queued (the caller checks whether its agents are still running)."""
        with self.cond:
            deadline = time.perf_counter() + poll_s
            while not self.calls and time.perf_counter() < deadline:
                self.cond.wait(timeout=max(0.0, deadline - time.perf_counter()))
            if not self.calls:
                return []
            while len(self.calls) < self.active and time.perf_counter() < self.first_at + wait_s:
                self.cond.wait(timeout=max(1e-4, self.first_at + wait_s - time.perf_counter()))
            out, self.calls, self.first_at = self.calls, [], None
            return out
