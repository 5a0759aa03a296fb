"""Agent programs as the rollout (``generate: {agent: ...}``): each sample is one run of the user's agent,
talking to the policy through an OpenAI-compatible endpoint the rollout serves (:mod:`nodes.rollout.agent_server`).

The agents run concurrently on an event loop of their own (``agent.concurrency`` at once). Their requests
queue at the endpoint; the rollout's thread takes them in batches (all of them once every running agent is
waiting, else what came within ``agent.batch_wait_s``) and samples each batch with the backend's ``sample``
(hf, vLLM), so requests of many agents are generated together, in the episodes' order (a batch's rows do
not depend on which request arrived first).

Token-exact trajectories. Per episode the endpoint keeps the tokens of the conversation so far, exactly as
they were sampled or appended. A new request's prompt is rendered by the model's chat template, the
assistant messages the endpoint produced replaced by the text it sampled; when that text begins with the
episode's tokens decoded, the prompt is those tokens plus the tokenised rest (the turns the agent added:
tool results, user messages), so nothing sampled is ever re-tokenised. When it does not (the agent edited
its history, or the template renders a past turn otherwise), the divergence is counted
(``retokenize_mismatch``), the request is sampled from the prompt as rendered, and the trajectory keeps the
tokens that were sampled, followed by the new turns: the sampler's log-probs of later turns then come from
the agent's edited context, and the decoupled loss weights them as off-policy. An episode is one training
sample: its first prompt, then a completion region (``agent.max_tokens`` columns) where ``response_mask`` marks
the sampled tokens only. Every request of a batch is served by the weights of the firing, so the staleness
proof and check cover agent episodes as any rollout.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import ssl
import sys
import time
import traceback
import uuid
from typing import Any

import torch

from omnigraph.sdk import ConfigError, Prompt
from omnigraph.sdk.registry import load_dotted

from nodes.models import vision
from nodes.models.vision import image_key
from nodes.rollout.agent_broker import AgentEpisode, AgentError, Broker, Call
from nodes.rollout.agent_chat import message_key, parse_tool_calls, plain, render, text_of
from nodes.rollout.agent_pictures import Expander, data_url, placeholders_in, request_pictures, task_messages
from nodes.rollout.agent_server import Endpoint
from nodes.rollout.agent_spans import AgentSpans
from nodes.rollout.episodes import EventLoop, after_message
from nodes.tasks.prompting import messages as prompt_messages


def _stop_at(tok, toks: list[int], stops: list[str]) -> int | None:
    """How many of ``toks`` to keep so that the text ends just before the first stop string (None: none in it)."""
    if not stops:
        return None
    text = tok.decode(toks, skip_special_tokens=True)
    if not any(s in text for s in stops):
        return None
    for k in range(1, len(toks) + 1):
        if any(s in tok.decode(toks[:k], skip_special_tokens=True) for s in stops):
            return k - 1
    return None


class Agents:
    """The agent rollout of one generate node (built once; ``run`` per batch)."""

    def __init__(self, rollout):
        self.rollout, self.tok = rollout, rollout.tok
        proc = getattr(rollout, "processor", None)         # an image-text policy: requests may hold pictures
        self.expander = Expander(proc) if proc is not None else None
        self.template = proc if getattr(proc, "chat_template", None) else rollout.tok
        self._pixels: dict[bytes, torch.Tensor] = {}
        self.spec = rollout.options.agent
        self.fn = None
        if self.spec.entry is not None:
            try:
                self.fn = load_dotted(self.spec.entry)
            except LookupError as e:
                raise ConfigError(f"cannot load the agent '{self.spec.entry}': {e}", where="agent.entry",
                                  fix="give module:function of an async function importable in the rollout") from e
        self.key = "sk-omnigraph-" + secrets.token_hex(16)
        self.broker = Broker()
        self.loop = EventLoop()
        self.endpoint = Endpoint(self, self.spec.host)
        self.stats: dict[str, float] = {}
        self.errors: list[str] = []
        self.tls: ssl.SSLContext | None = None
        partial = getattr(rollout.options, "partial", None)
        self.spans = None if partial is None else AgentSpans(self, partial, rollout.ctx.run.iterations)

    # -- the agents' side (their event loop) --------------------------------------------------------------
    def base_url(self, e: AgentEpisode) -> str:
        return f"{self.endpoint.url}/e/{e.eid}/v1"

    def task_of(self, p: Prompt) -> dict[str, Any]:
        if p.images:                  # as OpenAI image parts (data: URLs), and the pictures alone
            return {**p.meta, "prompt": p.text, "messages": task_messages(p),
                    "images": [data_url(b) for b in p.images]}
        return {**p.meta, "prompt": p.text, "messages": prompt_messages(p)}

    async def _program(self, e: AgentEpisode):
        task = self.task_of(e.prompt)
        if self.fn is not None:
            import openai
            if self.tls is None:
                self.tls = ssl.create_default_context()
            # one TLS context for every episode's client: building one loads the CA bundle (~40 ms a client,
            # most of an episode's cost on a small model), though the endpoint speaks plain HTTP
            client = openai.AsyncOpenAI(base_url=self.base_url(e), api_key=self.key, max_retries=0,
                                        timeout=self.spec.timeout_s,
                                        http_client=openai.DefaultAsyncHttpxClient(verify=self.tls))
            try:
                return await self.fn(client, task, **self.spec.options)
            finally:
                await client.close()
        env = {**os.environ, "OPENAI_BASE_URL": self.base_url(e), "OPENAI_API_KEY": self.key,
               "OMNIGRAPH_AGENT_OPTIONS": json.dumps(self.spec.options)}
        proc = await asyncio.create_subprocess_exec(*self.spec.command, stdin=asyncio.subprocess.PIPE,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                    env=env, start_new_session=True)
        try:
            out, err = await proc.communicate(json.dumps(task, default=str).encode())
        except asyncio.CancelledError:
            _kill_group(proc.pid)
            raise
        if proc.returncode != 0:
            raise RuntimeError(f"agent command exited with {proc.returncode}: "
                               f"{err.decode(errors='replace').strip()[-800:]}")
        lines = [x for x in out.decode(errors="replace").splitlines() if x.strip()]
        if not lines:
            raise RuntimeError("agent command printed nothing (its result: a number or JSON with reward)")
        return json.loads(lines[-1])

    async def _drive(self, e: AgentEpisode, sem: asyncio.Semaphore) -> None:
        async with sem:
            try:
                result = await asyncio.wait_for(self._program(e), self.spec.timeout_s)
                reward = result.get("reward") if isinstance(result, dict) else result
                if isinstance(reward, bool) or not isinstance(reward, (int, float)):
                    raise TypeError(f"the agent returned {type(reward).__name__} as its reward, not a number")
                e.reward = float(reward)
                if isinstance(result, dict):
                    e.info.update({k: v for k, v in result.items() if k != "reward"})
                e.status = "done"
            except asyncio.TimeoutError:
                e.status = "timeout"
                e.info["error"] = f"timed out after agent.timeout_s = {self.spec.timeout_s:g} s"
            except Exception as err:  # noqa: BLE001 - a user's program: keep its traceback, score it, go on
                e.status = "error"
                e.info["error"] = f"{type(err).__name__}: {err}"
                self.errors.append(f"episode {e.eid} ({e.prompt.text[:60]!r}):\n{traceback.format_exc()}")
            finally:
                self.broker.leave()

    async def _all(self, eps: list[AgentEpisode], sem: asyncio.Semaphore | None = None) -> None:
        sem = sem or asyncio.Semaphore(self.spec.concurrency)
        await asyncio.gather(*(self._drive(e, sem) for e in eps))

    # -- the rollout's side (its thread) --------------------------------------------------------------------
    def run(self, prompts: list[Prompt], n: int, *, greedy: bool, seed: int) -> tuple[dict, list[AgentEpisode]]:
        eps = [AgentEpisode(p, uuid.uuid4().hex, i * n + j) for i, p in enumerate(prompts) for j in range(n)]
        self.broker.open(eps, self.spec.concurrency)
        self.errors, self._pixels = [], {}
        t0 = time.perf_counter()
        done = asyncio.run_coroutine_threadsafe(self._all(eps), self.loop.loop)
        served, batches, rows_max, gen_s = 0, 0, 0, 0.0
        while True:
            calls = self.broker.take(self.spec.batch_wait_s)
            if calls:
                t1 = time.perf_counter()
                rows = self._serve(calls, greedy, (seed + 7919 * batches) % 2**31)
                gen_s += time.perf_counter() - t1
                batches, served, rows_max = batches + 1, served + len(calls), max(rows_max, rows)
            elif done.done():
                break
        done.result()
        for e in eps:
            if e.status == "running":       # cannot happen: gather returned; kept as a guard for the batch
                e.status = "error"
        wall = time.perf_counter() - t0
        self.stats = {"agent_requests": served, "agent_batches": batches, "agent_max_in_flight": rows_max,
                      "agent_requests_per_batch": served / max(batches, 1), "agent_gen_s": gen_s, "agent_s": wall,
                      "turns_mean": sum(e.requests for e in eps) / len(eps),
                      "tool_calls_per_episode": sum(e.tool_calls for e in eps) / len(eps),
                      "retokenize_mismatch": sum(e.mismatches for e in eps),
                      "agent_timeouts": sum(e.status == "timeout" for e in eps),
                      "agent_errors": sum(e.status == "error" for e in eps),
                      "episodes_truncated": sum(e.truncated for e in eps) / len(eps),
                      "agent_samples_per_episode": sum(len(e.samples()) for e in eps) / len(eps)}
        return self._batch(eps)

    def _prompt(self, e: AgentEpisode, call: Call) -> tuple[list[int], list[int] | None, list[bytes], int]:
        """``(sample_from, append, pictures, before)``: the tokens to sample the reply from, those the trajectory
        gains before the reply (the agent's new turns; untrained; None where the episode splits), the request's
        pictures, and how many of them come before the new turns."""
        tok, body, pics = self.tok, call.body, []
        if call.kind == "chat":
            msgs = body["messages"]
            if self.expander is not None:
                msgs, pics = request_pictures(msgs)
            msgs = plain(msgs, e.sampled)
            text = self._render(msgs, body.get("tools"), pics)
        else:
            text, msgs = body["prompt"], None
            if self.expander is not None:
                text = self.expander.expand(text, [])          # refuses a placeholder typed as text
        # a plain prompt starts with the model's bos, as the rollout's own prompts do (a chat template writes
        # its own); the text the client sends never holds it
        head = [tok.bos_token_id] if call.kind == "completion" and tok.bos_token_id is not None else []
        if e.ids is None:                                      # the episode's first request
            e.head = len(head)
            return head + tok(text, add_special_tokens=False).input_ids, [], pics, len(pics)
        said = tok.decode(e.ids[e.head:], skip_special_tokens=False)
        if not text.startswith(said):
            # a reply's text never shows the special tokens it sampled (the stop token that ended it, above
            # all): the client could not send them back, and they stay in the trajectory where they were sampled
            said = self._client_view(e)
        if text.startswith(said) and pics[:len(e.pictures)] == e.pictures:    # unchanged so far: extend it
            new = tok(text[len(said):], add_special_tokens=False).input_ids if len(text) > len(said) else []
            return e.ids + new, new, pics, len(e.pictures)
        e.mismatches += 1
        ids = head + tok(text, add_special_tokens=False).input_ids
        if self.spec.on_divergence == "split":
            return ids, None, pics, len(pics)                  # the caller starts a new sample from ids
        new, before = self._new_turns(e, msgs, body.get("tools"), text, pics)
        return ids, new, pics, before

    def _render(self, msgs, tools, pics: list[bytes], generation_prompt: bool = True) -> str:
        """The prompt text of ``msgs`` (its pictures' placeholders expanded into their image tokens)."""
        text = render(self.template, msgs, tools, generation_prompt)
        return text if self.expander is None else self.expander.expand(text, pics[:placeholders_in(msgs)])

    def pixels(self, pics: list[bytes]) -> list:
        """Each picture's pixel inputs (:mod:`nodes.models.vision`), computed once per picture in a batch of agents."""
        for b in dict.fromkeys(pics):
            if b not in self._pixels:
                self._pixels[b] = self.expander.pixels([b])
        return [self._pixels[b] for b in pics]

    def _client_view(self, e: AgentEpisode) -> str:
        """The conversation's text as the client has it: the sampled runs decoded as the replies were sent
        (without special tokens), the rest (prompt, the client's own turns) as the tokens spell it."""
        P, parts, run, sampled = e.prompt_len, [], [], None
        for k in range(e.head, len(e.ids)):
            flag = k >= P and bool(e.model[k - P])
            if flag != sampled and run:
                parts.append(self.tok.decode(run, skip_special_tokens=bool(sampled)))
                run = []
            sampled = flag
            run.append(e.ids[k])
        if run:
            parts.append(self.tok.decode(run, skip_special_tokens=bool(sampled)))
        return "".join(parts)

    def _new_turns(self, e: AgentEpisode, msgs, tools, text: str, pics: list[bytes]) -> tuple[list[int], int]:
        """After a divergence: the tokens of the turns after the agent's last assistant message, as the
        template renders them, to follow what was sampled in the trajectory; and the pictures before them."""
        if msgs is None:
            return [], len(pics)
        last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=None)
        if last is None:
            return [], len(pics)
        before = placeholders_in(msgs[:last + 1])
        base = self._render(msgs[:last + 1], tools, pics, generation_prompt=False)
        stopped = bool(e.tokens) and e.tokens[-1] in self.rollout.stops
        closing, _ = after_message(self.tok, base, text_of(msgs[last]["content"]), stopped)
        if not text.startswith(base):
            return self.tok(closing, add_special_tokens=False).input_ids, len(pics)
        return self.tok(closing + text[len(base):], add_special_tokens=False).input_ids, before

    def _serve(self, calls: list[Call], greedy: bool, seed: int) -> int:
        """Sample every live call's choices in one batch; answer each call's future. Returns the rows."""
        r, spec = self.rollout, self.spec
        rows, plan = [], []
        # in the episodes' order, not the order the requests arrived in: which row samples what does not
        # depend on timing (with the same batches, the same samples: a multi-turn environment's, for one)
        calls = sorted(calls, key=lambda c: (c.episode.step, c.episode.index))
        for c in calls:
            e = c.episode
            if e.status != "running":
                c.future.set_exception(AgentError(404, "the episode ended", "not_found_error"))
                continue
            try:
                ids, new, pics, before = self._prompt(e, c)
            except AgentError as err:
                c.future.set_exception(err)
                continue
            except Exception as err:  # noqa: BLE001 - a template that cannot render these messages
                c.future.set_exception(AgentError(400, f"cannot render the request: {type(err).__name__}: {err}"))
                continue
            if new is None:
                e.split(ids, pics, self.pixels(pics))
                new = []
            room = spec.max_tokens - len(e.tokens) - len(new)
            e.requests += 1
            if e.ids is None:
                e.ids, e.prompt_len = list(ids), len(ids)
                e.pictures, e.pixels = list(pics), self.pixels(pics)
            elif new:
                kept, shown = self._fit(new, max(0, spec.max_tokens - len(e.tokens)), pics[before:])
                e.add(kept, trained=False)
                e.pictures += shown
                e.pixels += self.pixels(shown)
            cap = min(c.max_tokens or r.options.max_new_tokens, r.options.max_new_tokens, room)
            if cap <= 0:
                e.truncated = True
                c.future.set_result(self._answer(c, [([], [], "length")], len(ids)))
                continue
            plan.append((c, ids, cap, len(rows), vision.concat(self.pixels(pics)) if pics else None))
            rows += [ids] * c.n
        if not rows:
            return 0
        seen = [p[4] for p in plan for _ in range(p[0].n)]
        out = r.sample(rows, 1, greedy=greedy, seed=seed, max_new_tokens=max(p[2] for p in plan),
                       **({"pixels": seen} if any(v is not None for v in seen) else {}))
        comp = out["input_ids"][:, out["prompt_len"]:]
        stops = set(r.stops)
        for c, ids, cap, first, _ in plan:
            e, choices = c.episode, []
            for j in range(c.n):
                i = first + j
                keep = out["response_mask"][i] > 0
                toks = comp[i][keep].tolist()[:cap]
                lps = out["logprob"][i][keep].tolist()[:len(toks)]
                cut = _stop_at(self.tok, toks, c.stop)
                reason = "stop" if toks and toks[-1] in stops else "length"
                if cut is not None:
                    toks, lps, reason = toks[:cut], lps[:cut], "stop"
                choices.append((toks, lps, reason))
            toks, lps, _ = choices[0]                          # the trajectory follows the first choice
            e.add(toks, trained=True, logprobs=lps, version=r.version)
            e.fired += len(toks)
            c.future.set_result(self._answer(c, choices, len(ids)))
        return len(rows)

    def _fit(self, new: list[int], room: int, pics: list[bytes]) -> tuple[list[int], list[bytes]]:
        """The first ``room`` of the new turns' tokens, cut before a picture that would not fit whole with a column
        after it for the reply (a picture's tokens and pixels go together; the trainer reads a row's last token
        only as a target), and the pictures kept."""
        if self.expander is None or not pics:
            return new[:room], []
        counts, image = self.expander.counts(pics), self.tok.convert_tokens_to_ids(self.expander.token)
        at = 0
        for k, n in enumerate(counts):
            at = new.index(image, at)
            if at + n >= room:
                return new[:at], pics[:k]
            at += n
        return new[:room], pics

    def _answer(self, c: Call, choices, prompt_tokens: int) -> dict[str, Any]:
        """What the endpoint shapes into an OpenAI response; the sampled replies are remembered by the episode
        (its ``sampled``) so that the agent's echo of them renders to the same tokens."""
        e, out = c.episode, []
        for toks, lps, reason in choices:
            text = self.tok.decode(toks, skip_special_tokens=True)
            item = {"text": text, "tokens": toks, "logprobs": lps, "finish_reason": reason}
            if c.kind == "chat":
                content, calls = ([text, []] if c.body.get("tool_choice") == "none"
                                  else parse_tool_calls(text, start=e.tool_calls))
                item.update(content=content, tool_calls=calls)
                e.sampled[message_key({"content": content, "tool_calls": calls})] = text
                if calls and reason == "stop":
                    item["finish_reason"] = "tool_calls"
            out.append(item)
        first = out[0]
        e.tool_calls += len(first.get("tool_calls") or [])
        e.last = first["text"]
        answer = {"choices": out, "prompt_tokens": prompt_tokens, "version": self.rollout.version}
        e.log.append(answer)
        return answer

    def _batch(self, eps: list[AgentEpisode]) -> tuple[dict, list[AgentEpisode]]:
        """The episodes' samples as one sample dict (the fields of ``Rollout.sample``), and the episode of each
        row: one sample per episode, more where ``on_divergence: split`` split one."""
        pad, C = self.tok.pad_token_id, self.spec.max_tokens
        rows = [(e, s) for e in eps for s in e.samples()]
        P = max(max((len(s[0]) for _, s in rows), default=1), 1)
        B = len(rows)
        ids = torch.full((B, P + C), pad, dtype=torch.long)
        mask = torch.zeros((B, P + C), dtype=torch.long)
        trained, lp = torch.zeros((B, C)), torch.zeros((B, C))
        versions = torch.full((B, C), -1, dtype=torch.long)
        for i, (e, (prompt, tokens, model, logprob, _, version, _)) in enumerate(rows):
            prompt = prompt or [pad]
            ids[i, P - len(prompt):P] = torch.tensor(prompt)
            mask[i, P - len(prompt):P] = 1
            t = min(len(tokens), C)
            if t:
                ids[i, P:P + t] = torch.tensor(tokens[:t])
                mask[i, P:P + t] = 1
                if not (e.status in ("timeout", "error") and self.spec.on_timeout == "drop"):
                    trained[i, :t] = torch.tensor(model[:t])
                lp[i, :t] = torch.tensor(logprob[:t])
                versions[i, :t] = torch.tensor(version[:t], dtype=torch.long)
        versions[trained == 0] = -1
        out = {"input_ids": ids, "attention_mask": mask, "response_mask": trained, "logprob": lp,
               "token_version": versions, "completion": [s[4] for _, s in rows], "prompt_len": P}
        if any(s[6] is not None for _, s in rows):           # pictures: each sample's, for the trainer
            out["pixel_values"] = [s[6] for _, s in rows]
            out["image_key"] = torch.tensor([image_key(s[6]) for _, s in rows], dtype=torch.long)
        return out, [e for e, _ in rows]

    def report(self) -> None:
        """One line per failed agent run on stderr; the tracebacks in the run directory's ``agent_errors.log``
        (``OMNIGRAPH_RUN_DIR``), or on stderr where there is none."""
        if not self.errors:
            return
        run_dir = os.environ.get("OMNIGRAPH_RUN_DIR")
        path = os.path.join(run_dir, "agent_errors.log") if run_dir and os.path.isdir(run_dir) else None
        for err in self.errors:
            last = err.strip().splitlines()[-1]
            print(f"{self.rollout.ctx.name}: an agent failed ({last[:200]}); scored by agent.on_timeout = "
                  f"{self.spec.on_timeout}" + (f" (traceback: {path})" if path else ""), file=sys.stderr)
        print_errors(self.errors, path)
        self.errors = []

    def close(self) -> None:
        self.endpoint.close()


def _kill_group(pid: int) -> None:
    """SIGKILL a command agent's whole process group (it was started in a session of its own)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def print_errors(errors: list[str], path: str | None) -> None:
    """Keep the agents' tracebacks (``path``: appended there; else on stderr)."""
    if not errors:
        return
    text = "".join(f"--- agent error, {time.strftime('%Y-%m-%d %H:%M:%S')}\n{e}\n" for e in errors)
    if path:
        with open(path, "a") as f:
            f.write(text)
    else:
        sys.stderr.write(text)
