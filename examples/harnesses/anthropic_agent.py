#!/usr/bin/env python3
"""A small terminal agent on the official Anthropic Python SDK (Messages).

Like openai_agent.py, an outside harness that knows nothing of rollout: the
SDK reads ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY, the task arrives on
stdin (or from ROLLOUT_PROMPT_FILE), the model's tool_use blocks are run
with subprocess and answered with tool_result blocks, and the last answer
is written to ./answer.txt.
"""
import argparse
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import anthropic

SYSTEM = "You are a terminal agent. Use the terminal tool to run shell commands, then answer."
TOOLS = [{
    "name": "terminal",
    "description": "Run a shell command in the sandbox and return its output.",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string", "description": "the shell command"}},
        "required": ["command"],
    },
}]


def run_tool(name, args):
    if name != "terminal":
        return "error: unknown tool %r" % name, True
    cmd = args.get("command") if isinstance(args, dict) else None
    if not isinstance(cmd, str):
        return "error: bad arguments %s" % json.dumps(args), True
    try:
        p = subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "error: timed out after 30s", True
    return (p.stdout + p.stderr)[-2000:] or "(no output, exit %d)" % p.returncode, p.returncode != 0


def complete(client, model, messages, stream):
    kw = dict(model=model, max_tokens=256, system=SYSTEM, messages=messages, tools=TOOLS)
    if not stream:
        return client.messages.create(**kw)
    return accumulate(client.messages.create(stream=True, **kw))


def accumulate(events):
    """The message a raw event stream describes.

    The SDK's messages.stream() helper would do this, but Debian sid's
    python3-anthropic (1.9.0) ships without jiter, and its fallback
    (pydantic_core.from_json(..., partial_mode=True)) raises TypeError on
    the first input_json_delta: every streamed tool_use. The raw events are
    the SDK's own typed stream all the same.
    """
    blocks, stop = {}, None
    for ev in events:
        if ev.type == "content_block_start":
            b = ev.content_block
            blocks[ev.index] = SimpleNamespace(type=b.type, text=getattr(b, "text", ""),
                                               thinking=getattr(b, "thinking", ""), signature=getattr(b, "signature", ""),
                                               id=getattr(b, "id", ""), name=getattr(b, "name", ""), input={}, json="")
        elif ev.type == "content_block_delta":
            b, d = blocks[ev.index], ev.delta
            if d.type == "text_delta":
                b.text += d.text
            elif d.type == "thinking_delta":
                b.thinking += d.thinking
            elif d.type == "signature_delta":
                b.signature += d.signature
            elif d.type == "input_json_delta":
                b.json += d.partial_json
        elif ev.type == "content_block_stop":
            b = blocks[ev.index]
            if b.type == "tool_use":
                b.input = json.loads(b.json) if b.json else {}
        elif ev.type == "message_delta":
            stop = ev.delta.stop_reason or stop
    return SimpleNamespace(content=[blocks[i] for i in sorted(blocks)], stop_reason=stop)


def history_blocks(msg):
    """The reply's content blocks as the harness sends them back."""
    out = []
    for b in msg.content:
        if b.type == "text":
            out.append({"type": "text", "text": b.text})
        elif b.type == "thinking":
            out.append({"type": "thinking", "thinking": b.thinking, "signature": b.signature})
        elif b.type == "tool_use":
            out.append({"type": "tool_use", "id": b.id, "name": b.name, "input": b.input})
    return out or [{"type": "text", "text": ""}]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--calls", type=int, default=3)
    a = ap.parse_args()
    if os.environ.get("ROLLOUT_PROMPT_FILE"):
        with open(os.environ["ROLLOUT_PROMPT_FILE"]) as f:
            prompt = f.read()
    else:
        prompt = sys.stdin.read()
    client = anthropic.Anthropic(timeout=300.0)
    model = os.environ.get("ROLLOUT_MODEL") or client.models.list().data[0].id
    messages = [{"role": "user", "content": prompt}]
    answer = ""
    for i in range(a.calls):
        msg = complete(client, model, messages, a.stream)
        answer = "".join(b.text for b in msg.content if b.type == "text") or answer
        messages.append({"role": "assistant", "content": history_blocks(msg)})
        uses = [b for b in msg.content if b.type == "tool_use"]
        if uses:
            results = []
            for b in uses:
                text, is_error = run_tool(b.name, b.input)
                results.append({"type": "tool_result", "tool_use_id": b.id, "content": text, "is_error": is_error})
            messages.append({"role": "user", "content": results})
        else:
            messages.append({"role": "user", "content": "Continue."})
        print("harness: call %d stop %s, %d tool uses" % (i + 1, msg.stop_reason, len(uses)), file=sys.stderr)
    with open("answer.txt", "w") as f:
        f.write(answer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
