"""A command agent with no dependencies at all: Python's standard library talking HTTP to the endpoint, the way
a program in any language or virtualenv would (``agent: {command: [python3, -S, examples/agents/stdlib_agent.py]}``;
``-S``: not even the site packages).

omnigraph runs it once per sample, with ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` in its environment and the
task (the data row) as JSON on stdin; the last line it prints is its result. Here: ask for the prompt's
completion, score it against the row's ``target``.
"""

import json
import os
import sys
import urllib.request


def chat(messages: list, max_tokens: int = 16) -> dict:
    request = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
        data=json.dumps({"model": "policy", "messages": messages, "max_tokens": max_tokens}).encode(),
        headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.load(response)


def main() -> None:
    task = json.load(sys.stdin)
    options = json.loads(os.environ.get("OMNIGRAPH_AGENT_OPTIONS") or "{}")
    reply = chat(task["messages"], options.get("max_tokens", 16))
    text = reply["choices"][0]["message"]["content"] or ""
    print(json.dumps({"reward": float(text.strip() == str(task.get("target", ""))), "reply": text}))


if __name__ == "__main__":
    main()
