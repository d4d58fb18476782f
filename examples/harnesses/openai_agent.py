#!/usr/bin/env python3
"""A small terminal agent on the official OpenAI Python SDK (Chat Completions).

It is an outside harness as rollout trains them: it knows nothing of
rollout, reads OPENAI_BASE_URL and OPENAI_API_KEY (the SDK does), takes the
task on stdin (or from ROLLOUT_PROMPT_FILE), offers one tool, runs the
model's shell commands itself with subprocess, and writes its last answer
to ./answer.txt. The flags make it misbehave on purpose (rollout's tests):
compact its history, crash, hang, or never call the model.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import openai

SYSTEM = "You are a terminal agent. Use the terminal tool to run shell commands, then answer."
TOOLS = [{
    "type": "function",
    "function": {
        "name": "terminal",
        "description": "Run a shell command in the sandbox and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string", "description": "the shell command"}},
            "required": ["command"],
        },
    },
}]


def run_tool(name, arguments):
    """Runs one call; a bad call is answered with an error, as a harness does."""
    if name != "terminal":
        return json.dumps({"error": "unknown tool %r" % name})
    try:
        args = json.loads(arguments or "{}")
        cmd = args["command"]
        if not isinstance(cmd, str):
            raise ValueError("command is not a string")
    except Exception as e:  # the model's arguments are data
        return json.dumps({"error": "bad arguments: %s" % e})
    try:
        p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return json.dumps({"error": "timed out after 30s"})
    return json.dumps({"output": (p.stdout + p.stderr)[-2000:], "exit_code": p.returncode})


def complete(client, model, messages, stream):
    """One model call: (content, tool calls as history dicts, finish reason)."""
    if not stream:
        r = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        m = r.choices[0].message
        calls = [{"id": c.id, "type": "function",
                  "function": {"name": c.function.name, "arguments": c.function.arguments}}
                 for c in (m.tool_calls or [])]
        return m.content or "", calls, r.choices[0].finish_reason
    content, calls, finish = [], {}, None
    for chunk in client.chat.completions.create(model=model, messages=messages, tools=TOOLS, stream=True):
        if not chunk.choices:
            continue
        ch = chunk.choices[0]
        if ch.delta.content:
            content.append(ch.delta.content)
        for tc in ch.delta.tool_calls or []:
            c = calls.setdefault(tc.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
            if tc.id:
                c["id"] = tc.id
            if tc.function is not None:
                c["function"]["name"] += tc.function.name or ""
                c["function"]["arguments"] += tc.function.arguments or ""
        if ch.finish_reason:
            finish = ch.finish_reason
    return "".join(content), [calls[i] for i in sorted(calls)], finish


RESPONSES_TOOLS = [dict(type="function", **TOOLS[0]["function"])]


def responses_loop(client, model, prompt, calls):
    """The Responses API (Codex-style): input items in, output items out."""
    items = [{"role": "user", "content": prompt}]
    answer = ""
    for i in range(calls):
        r = client.responses.create(model=model, instructions=SYSTEM, input=items, tools=RESPONSES_TOOLS)
        answer = r.output_text or answer
        # The reply's items first, then one output per call (a reply with
        # parallel calls is echoed as it came, as Codex does).
        items.extend(out.model_dump(exclude_none=True) for out in r.output)
        uses = 0
        for out in r.output:
            if out.type == "function_call":
                uses += 1
                items.append({"type": "function_call_output", "call_id": out.call_id,
                              "output": run_tool(out.name, out.arguments)})
        if not uses:
            items.append({"role": "user", "content": "Continue."})
        print("harness: responses call %d status %s, %d function calls" % (i + 1, r.status, uses), file=sys.stderr)
    return answer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stream", action="store_true", help="stream every call")
    ap.add_argument("--calls", type=int, default=3, help="model calls to make")
    ap.add_argument("--compact-after", type=int, default=0,
                    help="after this many calls, replace the history with a summary")
    ap.add_argument("--crash-after", type=int, default=0, help="exit 3 after this many calls")
    ap.add_argument("--hang-after", type=int, default=0, help="sleep forever after this many calls")
    ap.add_argument("--no-call", action="store_true", help="exit 0 without calling the model")
    ap.add_argument("--responses", action="store_true", help="use the Responses API, not Chat Completions")
    ap.add_argument("--pad", type=int, default=0, help="append this many words to the prompt (overflow the context)")
    a = ap.parse_args()

    if os.environ.get("ROLLOUT_PROMPT_FILE"):
        with open(os.environ["ROLLOUT_PROMPT_FILE"]) as f:
            prompt = f.read()
    else:
        prompt = sys.stdin.read()
    if a.no_call:
        return 0
    prompt += " pad" * a.pad
    client = openai.OpenAI(timeout=300.0)
    model = os.environ.get("ROLLOUT_MODEL") or client.models.list().data[0].id
    if a.responses:
        answer = responses_loop(client, model, prompt, a.calls)
        with open("answer.txt", "w") as f:
            f.write(answer)
        return 0
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]
    answer = ""
    for i in range(a.calls):
        if a.compact_after and i == a.compact_after:
            # Compaction: the history is replaced by a summary (a new branch).
            messages = [messages[0], {"role": "user", "content": prompt + "\nSummary of the work so far: %d calls, no result yet." % i}]
        content, calls, finish = complete(client, model, messages, a.stream)
        answer = content or answer
        if a.crash_after and i + 1 >= a.crash_after:
            print("harness: crashing on purpose after %d calls" % (i + 1), file=sys.stderr)
            return 3
        if a.hang_after and i + 1 >= a.hang_after:
            while True:
                time.sleep(3600)
        msg = {"role": "assistant", "content": content}
        if calls:
            msg["tool_calls"] = calls
        messages.append(msg)
        if calls:
            for c in calls:
                messages.append({"role": "tool", "tool_call_id": c["id"],
                                 "content": run_tool(c["function"]["name"], c["function"]["arguments"])})
        else:
            messages.append({"role": "user", "content": "Continue."})
        print("harness: call %d finish %s, %d tool calls" % (i + 1, finish, len(calls)), file=sys.stderr)
    with open("answer.txt", "w") as f:
        f.write(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
