"""The OpenAI-compatible endpoint an agent rollout serves (:mod:`nodes.rollout.agents`): FastAPI on uvicorn, in a
thread of the rollout's process (this module is imported only where an agent rollout runs), bound to ``agent.host`` (127.0.0.1 by default) on a free port.

Each agent run gets its own base URL, ``http://HOST:PORT/e/<episode>/v1``, and the run's key (a random
``sk-omnigraph-...`` per rollout): ``/chat/completions`` (messages, tools, tool_choice, n, max_tokens or
max_completion_tokens, stop, logprobs, stream; an image-text policy reads image parts as ``data:`` URLs,
:mod:`nodes.rollout.agent_pictures`), ``/completions`` (prompt, n, max_tokens, stop, logprobs,
stream) and ``/models``. Sampling follows the node, not the request: ``temperature`` and ``top_p`` are those of
the generate node, so what is trained is what was sampled (a request's own are accepted and ignored), and
``seed`` is the firing's. ``stream: true`` answers as server-sent events once the reply is sampled (one
chunk, then ``[DONE]``). Every refusal is an OpenAI-shaped error (status, type, message, param) and never
takes the node down: an unknown episode (404), a wrong key (401), a body over ``agent.max_request_bytes``
(413), a malformed request (400), too many waiting (429).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from nodes.rollout.agent_broker import AgentError, Call
from nodes.rollout.agent_pictures import check_parts

ROLES = {"system", "developer", "user", "assistant", "tool"}


def _error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None):
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": None}}, status_code=status)


def _int(body: dict, name: str, lo: int, hi: int, default=None):
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise AgentError(400, f"'{name}' must be an integer from {lo} to {hi}, not {v!r}", param=name)
    return v


def _stops(body: dict) -> list[str]:
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else (stop or [])
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
        raise AgentError(400, "'stop' must be a string or a list of up to 4 non-empty strings", param="stop")
    return stop


def _check_messages(body: dict, pictures: bool) -> None:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise AgentError(400, "'messages' must be a non-empty list of messages", param="messages")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise AgentError(400, f"messages[{i}] needs a role of {sorted(ROLES)}", param=f"messages[{i}].role")
        c = m.get("content")
        if c is not None and not isinstance(c, (str, list)):
            raise AgentError(400, f"messages[{i}].content must be a string or a list of parts",
                             param=f"messages[{i}].content")
    check_parts(msgs, pictures)
    tools = body.get("tools")
    if tools is not None and (not isinstance(tools, list) or
                              any(not isinstance(t, dict) or t.get("type") != "function" for t in tools)):
        raise AgentError(400, "'tools' must be a list of {type: function, function: {...}}", param="tools")
    if body.get("top_logprobs"):
        raise AgentError(400, "top_logprobs is not served: the endpoint returns each sampled token's logprob",
                         param="top_logprobs")


def build_app(agents):
    """The FastAPI application of ``agents`` (an :class:`nodes.rollout.agents.Agents`)."""
    spec = agents.spec
    app = FastAPI(title="omnigraph agent endpoint", docs_url=None, redoc_url=None, openapi_url=None)
    model_name = getattr(agents.rollout, "model_name", None) or "policy"

    async def body_of(request: Request, eid: str) -> dict:
        if request.headers.get("authorization", "") != f"Bearer {agents.key}":
            raise AgentError(401, "invalid API key: use the key the run gave this agent (OPENAI_API_KEY)",
                             "authentication_error")
        agents.broker.episode(eid)
        size = request.headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > spec.max_request_bytes):
            raise AgentError(413, f"request body over agent.max_request_bytes = {spec.max_request_bytes}",
                             "request_too_large")
        raw = b""
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > spec.max_request_bytes:
                raise AgentError(413, f"request body over agent.max_request_bytes = {spec.max_request_bytes}",
                                 "request_too_large")
        try:
            body = json.loads(raw)
        except ValueError:
            raise AgentError(400, "the body is not JSON") from None
        if not isinstance(body, dict):
            raise AgentError(400, "the body must be a JSON object")
        return body

    async def serve(eid: str, kind: str, body: dict) -> dict:
        e = agents.broker.episode(eid)
        if e.replay:                    # resumed in flight: the program runs again, given the answers it had
            e.replay -= 1
            return e.log[len(e.log) - e.replay - 1]
        if e.requests >= spec.max_turns:
            raise AgentError(400, f"this episode made agent.max_turns = {spec.max_turns} requests", param="max_turns")
        n = _int(body, "n", 1, spec.max_n, 1)
        limit = body.get("max_completion_tokens", body.get("max_tokens"))
        max_tokens = _int({"max_tokens": limit}, "max_tokens", 1, 1 << 20)
        call = Call(e, kind, body, n, max_tokens, _stops(body))
        return await asyncio.wrap_future(agents.broker.submit(call, limit=4 * spec.concurrency))

    @app.exception_handler(AgentError)
    async def _refused(request, err: AgentError):
        return _error(err.status, str(err), err.kind, err.param)

    @app.exception_handler(Exception)
    async def _failed(request, err: Exception):
        return _error(500, f"the endpoint failed on this request: {type(err).__name__}: {err}", "server_error")

    @app.get("/e/{eid}/v1/models")
    async def models(eid: str, request: Request):
        if request.headers.get("authorization", "") != f"Bearer {agents.key}":
            raise AgentError(401, "invalid API key", "authentication_error")
        return {"object": "list", "data": [{"id": model_name, "object": "model", "created": 0,
                                            "owned_by": "omnigraph"}]}

    @app.post("/e/{eid}/v1/chat/completions")
    async def chat(eid: str, request: Request):
        body = await body_of(request, eid)
        _check_messages(body, agents.expander is not None)
        res = await serve(eid, "chat", body)
        made = int(time.time())
        cid = f"chatcmpl-{eid[:8]}-{agents.broker.episodes[eid].requests}"
        choices = []
        for i, c in enumerate(res["choices"]):
            msg: dict[str, Any] = {"role": "assistant", "content": c["content"] if c["content"] or not c["tool_calls"]
                                   else None}
            if c["tool_calls"]:
                msg["tool_calls"] = c["tool_calls"]
            choice = {"index": i, "message": msg, "finish_reason": c["finish_reason"], "logprobs": None}
            if body.get("logprobs"):
                choice["logprobs"] = {"content": _token_logprobs(agents.tok, c), "refusal": None}
            choices.append(choice)
        usage = _usage(res)
        if body.get("stream"):
            return StreamingResponse(_chat_events(cid, made, model_name, choices, usage, body),
                                     media_type="text/event-stream")
        return JSONResponse({"id": cid, "object": "chat.completion", "created": made, "model": model_name,
                             "choices": choices, "usage": usage,
                             "system_fingerprint": f"weights-v{res['version']}"})

    @app.post("/e/{eid}/v1/completions")
    async def completions(eid: str, request: Request):
        body = await body_of(request, eid)
        if not isinstance(body.get("prompt"), str) or not body["prompt"]:
            raise AgentError(400, "'prompt' must be a non-empty string", param="prompt")
        res = await serve(eid, "completion", body)
        made = int(time.time())
        choices = [{"index": i, "text": c["text"], "finish_reason": c["finish_reason"],
                    "logprobs": ({"tokens": [agents.tok.decode([t]) for t in c["tokens"]],
                                  "token_logprobs": c["logprobs"]} if body.get("logprobs") else None)}
                   for i, c in enumerate(res["choices"])]
        out = {"id": f"cmpl-{eid[:8]}", "object": "text_completion", "created": made, "model": model_name,
               "choices": choices, "usage": _usage(res)}
        if body.get("stream"):
            return StreamingResponse(_events([out, "[DONE]"]), media_type="text/event-stream")
        return out

    return app


def _usage(res: dict) -> dict:
    done = sum(len(c["tokens"]) for c in res["choices"])
    return {"prompt_tokens": res["prompt_tokens"], "completion_tokens": done,
            "total_tokens": res["prompt_tokens"] + done}


def _token_logprobs(tok, c: dict) -> list[dict]:
    out = []
    for t, lp in zip(c["tokens"], c["logprobs"]):
        text = tok.decode([t])
        out.append({"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": []})
    return out


async def _events(items):
    for item in items:
        yield f"data: {item if isinstance(item, str) else json.dumps(item)}\n\n"


def _chat_events(cid: str, made: int, model: str, choices: list, usage: dict, body: dict):
    """A sampled reply as OpenAI's stream of chunks: the role, the content, the tool calls, the finish."""
    def chunk(i: int, delta: dict, finish=None, logprobs=None):
        return {"id": cid, "object": "chat.completion.chunk", "created": made, "model": model,
                "choices": [{"index": i, "delta": delta, "finish_reason": finish, "logprobs": logprobs}]}
    items = []
    for c in choices:
        i, msg = c["index"], c["message"]
        items.append(chunk(i, {"role": "assistant", "content": ""}))
        if msg.get("content"):
            items.append(chunk(i, {"content": msg["content"]}, logprobs=c["logprobs"]))
        if msg.get("tool_calls"):
            items.append(chunk(i, {"tool_calls": [{"index": k, **tc} for k, tc in enumerate(msg["tool_calls"])]}))
        items.append(chunk(i, {}, finish=c["finish_reason"]))
    if (body.get("stream_options") or {}).get("include_usage"):
        items.append({"id": cid, "object": "chat.completion.chunk", "created": made, "model": model, "choices": [],
                      "usage": usage})
    return _events(items + ["[DONE]"])


class Endpoint:
    """The app served by uvicorn in a daemon thread, on a free port of ``host``."""

    def __init__(self, agents, host: str):

        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, 0))
        self.port = sock.getsockname()[1]
        self.url = f"http://{'[' + host + ']' if ':' in host else host}:{self.port}"
        config = uvicorn.Config(build_app(agents), log_level="warning", access_log=False, lifespan="off",
                                timeout_keep_alive=30)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True,
                                       name="omnigraph-agent-endpoint")
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the agent endpoint did not start on {host}:{self.port}")
            time.sleep(0.01)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
