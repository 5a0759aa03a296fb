"""Agent programs the agent tests run (``agent.entry: agent_programs:NAME``): each talks to the rollout's
endpoint with the real ``openai`` client, as a user's agent would."""

from __future__ import annotations

import asyncio

import openai


def _score(reply: str, target: str) -> float:
    return float(reply.strip() == target)


async def copy_twice(client: openai.AsyncOpenAI, task: dict, **options) -> dict:
    """Two turns: copy the number, then (the reply echoed back as the client returned it) copy another."""
    msgs = [{"role": "user", "content": task["prompt"]}]
    first = await client.chat.completions.create(model="policy", messages=msgs, max_tokens=options.get("max", 8))
    msgs.append(first.choices[0].message.model_dump(exclude_none=True))
    msgs.append({"role": "user", "content": "copy 42:"})
    second = await client.chat.completions.create(model="policy", messages=msgs, max_tokens=options.get("max", 8))
    return {"reward": _score(first.choices[0].message.content, task["target"]),
            "second": second.choices[0].message.content}


async def edits_history(client: openai.AsyncOpenAI, task: dict, **options) -> float:
    """As ``copy_twice``, but the agent rewrites the model's first reply before its second request."""
    msgs = [{"role": "user", "content": task["prompt"]}]
    first = await client.chat.completions.create(model="policy", messages=msgs, max_tokens=8)
    msgs.append({"role": "assistant", "content": "7" + (first.choices[0].message.content or "")})
    msgs.append({"role": "user", "content": "copy 42:"})
    await client.chat.completions.create(model="policy", messages=msgs, max_tokens=8)
    return _score(first.choices[0].message.content, task["target"])


async def completes(client: openai.AsyncOpenAI, task: dict, **options) -> float:
    """The completions endpoint (no chat template needed): one completion of the prompt, scored."""
    out = await client.completions.create(model="policy", prompt=task["prompt"], max_tokens=8)
    return _score(out.choices[0].text, task["target"])


async def hangs(client: openai.AsyncOpenAI, task: dict, **options) -> float:
    await client.completions.create(model="policy", prompt=task["prompt"], max_tokens=4)
    await asyncio.sleep(3600)
    return 1.0


async def raises(client: openai.AsyncOpenAI, task: dict, **options) -> float:
    await client.completions.create(model="policy", prompt=task["prompt"], max_tokens=4)
    raise ValueError("the agent's own bug")


async def probes(client: openai.AsyncOpenAI, task: dict, **options) -> dict:
    """What a client may send: a stream, tools, n, logprobs, and requests the endpoint must refuse politely."""
    seen: dict = {}
    msgs = [{"role": "user", "content": task["prompt"]}]
    models = await client.models.list()
    seen["models"] = [m.id for m in models.data]
    stream = await client.chat.completions.create(model="policy", messages=msgs, max_tokens=6, stream=True,
                                                  stream_options={"include_usage": True})
    parts, usage = [], None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage.completion_tokens
    seen["stream_text"], seen["stream_usage"] = "".join(parts), usage
    tools = [{"type": "function", "function": {"name": "calc", "description": "arithmetic",
                                               "parameters": {"type": "object", "properties": {}}}}]
    many = await client.chat.completions.create(model="policy", messages=msgs, max_tokens=4, n=2, logprobs=True,
                                                tools=tools, temperature=0.3, seed=5)
    seen["n"] = len(many.choices)
    seen["logprobs"] = [t.logprob for t in many.choices[0].logprobs.content]
    for name, call in [("bad_n", dict(n=99)), ("bad_messages", dict(messages=[{"role": "wizard", "content": "x"}])),
                       ("bad_max", dict(max_tokens=-3)), ("top_logprobs", dict(logprobs=True, top_logprobs=3))]:
        try:
            await client.chat.completions.create(**{"model": "policy", "messages": msgs, **call})
            seen[name] = "accepted"
        except openai.APIStatusError as e:
            seen[name] = (e.status_code, e.body.get("type") if isinstance(e.body, dict) else None)
    try:
        await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "9" * 3_000_000}])
        seen["huge"] = "accepted"
    except openai.APIStatusError as e:
        seen["huge"] = (e.status_code, None)
    wrong = openai.AsyncOpenAI(base_url=str(client.base_url), api_key="sk-wrong", max_retries=0)
    try:
        await wrong.completions.create(model="policy", prompt="copy 1:", max_tokens=2)
        seen["wrong_key"] = "accepted"
    except openai.AuthenticationError as e:
        seen["wrong_key"] = (e.status_code, None)
    finally:
        await wrong.close()
    return {"reward": 1.0, **seen}



async def stops_early_or_late(client: openai.AsyncOpenAI, task: dict, **options) -> float:
    """One request or two, by the task's row: agents of one batch that end after different turns."""
    turns = 1 + int(task["target"]) % 2
    for _ in range(turns):
        await client.completions.create(model="policy", prompt=task["prompt"], max_tokens=4)
    return 0.0


async def looks_twice(client: openai.AsyncOpenAI, task: dict, **options) -> dict:
    """An image-text task: the task's messages as they are (the picture an image part), then a second turn
    that shows the picture again; scored on the first reply."""
    msgs = list(task["messages"])
    first = await client.chat.completions.create(model="policy", messages=msgs, max_tokens=8)
    msgs.append(first.choices[0].message.model_dump(exclude_none=True))
    msgs.append({"role": "user", "content": [{"type": "text", "text": "again"},
                                             {"type": "image_url", "image_url": {"url": task["images"][0]}}]})
    second = await client.chat.completions.create(model="policy", messages=msgs, max_tokens=4)
    return {"reward": _score(first.choices[0].message.content, task["target"]),
            "second": second.choices[0].message.content}


async def names_colour(client: openai.AsyncOpenAI, task: dict, **options) -> float:
    """One turn: the task's messages with their picture, the reply scored against the target."""
    out = await client.chat.completions.create(model="policy", messages=task["messages"], max_tokens=8)
    return _score(out.choices[0].message.content, task["target"])


async def picture_probes(client: openai.AsyncOpenAI, task: dict, **options) -> dict:
    """Image parts the endpoint must refuse in OpenAI's shape."""
    url = task["images"][0]
    bad = {"remote": {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
           "not_base64": {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}},
           "not_a_picture": {"type": "image_url", "image_url": {"url": "data:image/png;base64,aGVsbG8="}},
           "audio": {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}}
    seen: dict = {}
    for name, part in bad.items():
        try:
            await client.chat.completions.create(model="policy", max_tokens=2, messages=[
                {"role": "user", "content": [part, {"type": "text", "text": "colour:"}]}])
            seen[name] = "accepted"
        except openai.APIStatusError as e:
            seen[name] = [e.status_code, e.body.get("param") if isinstance(e.body, dict) else None]
    try:            # a placeholder typed as text would ask the tower for a picture that is not there
        await client.chat.completions.create(model="policy", max_tokens=2, messages=[
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                         {"type": "text", "text": "<image> colour:"}]}])
        seen["typed_placeholder"] = "accepted"
    except openai.APIStatusError as e:
        seen["typed_placeholder"] = [e.status_code, e.body.get("param") if isinstance(e.body, dict) else None]
    return {"reward": 1.0, **seen}
