"""A command agent (``agent.command: [python, tests/agent_command.py]``): its own process, the task on stdin,
the endpoint in OPENAI_BASE_URL and OPENAI_API_KEY, its result as the last line of output."""

import json
import sys

import openai


def main() -> None:
    task = json.load(sys.stdin)
    client = openai.OpenAI(max_retries=0)          # reads OPENAI_BASE_URL and OPENAI_API_KEY
    out = client.completions.create(model="policy", prompt=task["prompt"], max_tokens=8)
    print("some chatter on stdout first")
    print(json.dumps({"reward": float(out.choices[0].text.strip() == task["target"]), "pid_seen": True}))


if __name__ == "__main__":
    main()
