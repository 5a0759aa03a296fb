"""Chat messages in, tokens out, and back: what the agents' endpoint (:mod:`nodes.rollout.agent_server`) needs
from a chat template.

- :func:`parse_tool_calls`: the tool calls a reply holds, in the format Hermes and Qwen templates define
  (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``), as OpenAI ``tool_calls``; the rest of the
  text is the message's ``content``.
- :func:`message_key`: an assistant message as the client sends it back (content and tool calls), so the
  endpoint can find the reply it sampled and render it as sampled, not as re-serialised.
- :func:`plain`: the messages as the template takes them (text, or text and image parts).
- :func:`render`: the prompt text of a request, by the model's own chat template (tools included when the
  template takes them).

>>> content, calls = parse_tool_calls('Let me compute.<tool_call>\\n{"name": "calc", "arguments": {"x": "6*7"}}\\n</tool_call>')
>>> content, calls[0]["function"]["name"], json.loads(calls[0]["function"]["arguments"])
('Let me compute.', 'calc', {'x': '6*7'})
>>> parse_tool_calls("<tool_call>not json</tool_call>")[1]
[]
"""

from __future__ import annotations

import json
import re
from typing import Any

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)


def parse_tool_calls(text: str, start: int = 0) -> tuple[str, list[dict[str, Any]]]:
    """``(content, tool_calls)`` of a sampled reply; a block that is not a JSON object with a ``name`` stays in
    the content as written (the model's mistake is the agent's to see). ``start`` numbers the calls' ids."""
    calls, kept, at = [], [], 0
    for m in TOOL_CALL.finditer(text):
        try:
            body = json.loads(m.group(1))
        except ValueError:
            continue
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            continue
        args = body.get("arguments", body.get("parameters", {}))
        calls.append({"id": f"call_{start + len(calls)}", "type": "function",
                      "function": {"name": body["name"],
                                   "arguments": args if isinstance(args, str) else json.dumps(args)}})
        kept.append(text[at:m.start()])
        at = m.end()
    kept.append(text[at:])
    return "".join(kept).strip() if calls else text, calls


def message_key(message: dict[str, Any]) -> str:
    """An assistant message's identity as a client echoes it: its content and its tool calls' names and
    arguments (not their ids, which clients may rewrite)."""
    calls = [(c.get("function", {}).get("name"), _canonical(c.get("function", {}).get("arguments")))
             for c in message.get("tool_calls") or []]
    return json.dumps([text_of(message.get("content")), calls], sort_keys=True)


def _canonical(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def text_of(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    raise ValueError("content must be a string or a list of parts")


def _content(content: Any) -> Any:
    """A message's content for the template: its text, or its parts where it holds pictures (``{"type": "image"}``
    parts, :mod:`nodes.rollout.agent_pictures`), text parts in between."""
    if isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "image" for p in content):
        return [p if p.get("type") == "image" else {"type": "text", "text": p.get("text", "")} for p in content]
    return text_of(content)


def plain(messages: list[dict[str, Any]], sampled: dict[str, str]) -> list[dict[str, Any]]:
    """The messages as the template renders them: text contents, and each assistant message the endpoint
    sampled replaced by the text it sampled (``sampled``: :func:`message_key` -> text), so that unedited
    history renders to the tokens it was sampled as."""
    out = []
    for m in messages:
        role = m.get("role")
        if role == "assistant" and message_key(m) in sampled:
            out.append({"role": "assistant", "content": sampled[message_key(m)]})
            continue
        msg = {"role": role, "content": _content(m.get("content"))}
        if role == "assistant" and m.get("tool_calls") and isinstance(msg["content"], str):        # written by the client: as the template's format
            msg["content"] += "".join(
                f"<tool_call>\n{json.dumps({'name': c['function']['name'], 'arguments': _canonical(c['function'].get('arguments'))})}\n</tool_call>"
                for c in m["tool_calls"])
        if role == "tool" and m.get("name"):
            msg["name"] = m["name"]
        out.append(msg)
    return out


def render(tok, messages: list[dict[str, Any]], tools: list | None, generation_prompt: bool = True) -> str:
    """The prompt text of ``messages`` by the model's chat template (with ``tools`` where it takes them)."""
    kwargs = {"tools": tools} if tools else {}
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs)
