"""A minimal third-party-style harness (standard library only) run inside the sandbox by the
`harness` tests: it knows nothing of hpc-rollout except OPENAI_BASE_URL, OPENAI_API_KEY and the
task file. It keeps its own message history and runs the model's bash calls itself.

    python3 toy_agent.py [--drop-at N] [--probe PATH]
        --drop-at: before call N, forget the first exchange
        --probe: first GET PATH (e.g. /files) from the API, as clients probe endpoints at start
"""

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request

TOOLS = [{"type": "function", "function": {
    "name": "bash", "description": "Run a bash command.",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


def ask(messages):
    body = json.dumps({"model": "policy", "messages": messages, "tools": TOOLS}).encode()
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", body, {
        "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(request, timeout=300))["choices"][0]["message"]


def probe(path):
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + path, headers={
        "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    try:
        urllib.request.urlopen(request, timeout=60)
        print("probe", path, "served")
    except urllib.error.HTTPError as exc:
        print("probe", path, exc.code, exc.read().decode()[:200])


def main():
    drop_at = int(sys.argv[sys.argv.index("--drop-at") + 1]) if "--drop-at" in sys.argv else -1
    if "--probe" in sys.argv:
        probe(sys.argv[sys.argv.index("--probe") + 1])
    with open(os.environ["HPC_ROLLOUT_TASK_FILE"]) as handle:
        task = handle.read()
    messages = [{"role": "system", "content": "You solve tasks with bash."}, {"role": "user", "content": task}]
    for step in range(100):
        if step == drop_at:
            messages = messages[:2] + messages[4:]
        try:
            message = ask(messages)
        except urllib.error.HTTPError as exc:
            print("refused:", exc.code, exc.read().decode()[:300])
            return 3
        messages.append(message)
        calls = message.get("tool_calls") or []
        if not calls:
            print("FINAL:", message.get("content"))
            return 0
        for call in calls:
            command = json.loads(call["function"]["arguments"])["command"]
            done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": done.stdout + done.stderr})
    return 1


if __name__ == "__main__":
    sys.exit(main())
