#!/usr/bin/python3
"""An asynchronous GRPO trainer loop against `rollout serve`.

Collection never stops: the trainer keeps two groups in flight on a
CollectGroups stream and, after each group it consumes, runs a (pretend)
training step and pushes "new weights" into the engine mid-flight:

    BeginPolicyUpdate(stream, v+1, mode)  -> engines paused (keep|wait|abort)
    load weights into the engine           -> here: SGLang's
                                              POST /update_weights_from_disk
    EndPolicyUpdate(stream, v+1)           -> engines resumed, tokens stamped v+1
    CollectCredit(groups=1, trainer_version=v+1)

Every group is checked: each rollout's token_versions align with its
tokens, the group's policy_lag never exceeds async.max_staleness, and
abort cuts (version_cuts) sit where the token versions change. The
behaviour logprobs are what importance correction needs; see
docs/async-rl.md.

    rollout sim --env toolcall-match --per-token 5ms --port 8000 &
    rollout serve --listen 127.0.0.1:50051 &
    /usr/bin/python3 examples/python/async_trainer.py \\
        --addr 127.0.0.1:50051 --endpoint http://127.0.0.1:8000 --mode abort
"""

import argparse
import json
import math
import os
import sys
import time
import urllib.request
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import rollout
except ImportError:  # not installed: the checkout's package
    sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
    import rollout

from rollout import Client, RolloutError  # noqa: E402


def config(args):
    return "\n".join([
        "env: " + args.env,
        "group_size: %d" % args.group_size,
        "inference:",
        "  backend: vllm",
        "  endpoints: [%s]" % args.endpoint,
        "parser: hermes",
        "sampling: {max_tokens: 256}",
        "async: {max_staleness: %d, on_stale: regenerate}" % args.max_staleness,
    ]) + "\n"


def load_weights(endpoint, version):
    """Stands in for the trainer's weight transfer: SGLang's
    update_weights_from_disk, which the simulator serves."""
    body = json.dumps({"model_path": "/ckpt/step-%d" % version, "weight_version": str(version)}).encode()
    req = urllib.request.Request(endpoint + "/update_weights_from_disk", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        if resp.status != 200:
            raise RuntimeError("weight load: HTTP %d" % resp.status)


def check_group(g, max_staleness):
    """Returns a list of problems with the group's (rollout.Group) version
    fields."""
    bad = []
    if g.policy_lag is None or g.min_policy_version is None:
        bad.append("no version summary")
    elif g.policy_lag > max_staleness:
        bad.append("lag %d > max_staleness %d" % (g.policy_lag, max_staleness))
    for r in g.rollouts:
        if not r.ok:
            continue
        if len(r.token_versions) != len(r.tokens):
            bad.append("rollout %d: %d versions for %d tokens" % (r.index, len(r.token_versions), len(r.tokens)))
            continue
        sampled = [v for v, m in zip(r.token_versions, r.loss_mask) if m]
        if sampled and min(sampled) < g.min_policy_version:
            bad.append("rollout %d: a token older than the group's min_policy_version" % r.index)
        for c in r.raw.version_cuts:
            if c.kind == "abort" and not (r.token_versions[c.position - 1] == getattr(c, "from")
                                          and r.token_versions[c.position] == c.to):
                bad.append("rollout %d: cut at %d does not match the token versions" % (r.index, c.position))
    return bad


def train_step(g):
    """A pretend policy-gradient step: the importance-weighted surrogate
    over sampled tokens, with the behaviour logprobs as recorded (a real
    trainer recomputes current logprobs and takes exp(new - old))."""
    total, n = 0.0, 0
    for r in g.rollouts:
        if not r.ok or r.advantage is None or r.logprobs is None:
            continue
        for lp, m in zip(r.logprobs, r.loss_mask):
            if m:
                ratio = math.exp(lp - lp)  # new == old in this pretend step
                total += ratio * r.advantage
                n += 1
    time.sleep(0.2)  # the GPU time collection overlaps with
    return total / n if n else 0.0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--addr", default=os.environ.get("ROLLOUT_ADDR", "127.0.0.1:50051"))
    ap.add_argument("--endpoint", default="http://127.0.0.1:8000", help="the engine (rollout sim)")
    ap.add_argument("--env", default="toolcall-match")
    ap.add_argument("--groups", type=int, default=6, help="groups to train on")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--in-flight", type=int, default=2, help="groups collected ahead of training")
    ap.add_argument("--max-staleness", type=int, default=1)
    ap.add_argument("--mode", default="abort", choices=["keep", "wait", "abort"])
    ap.add_argument("--wait", type=float, default=60)
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()

    stream_id = "async-trainer-" + uuid.uuid4().hex[:8]
    version, received, updates, cuts, max_lag, problems = 0, 0, 0, 0, 0, []
    with Client(args.addr, timeout=60) as client:
        client.wait_ready(args.wait)
        with client.collect(config(args), initial_credits=args.in_flight, stream_id=stream_id,
                            timeout=args.timeout) as stream:
            stream.next(args.groups, request_id="async")
            while received < args.groups:
                g = stream.get(timeout=args.timeout)
                received += 1
                bad = check_group(g, args.max_staleness)
                problems += ["group %s: %s" % (g.group_id, b) for b in bad]
                n_cuts = sum(1 for r in g.rollouts for c in r.raw.version_cuts if c.kind == "abort")
                cuts += n_cuts
                max_lag = max(max_lag, g.policy_lag or 0)
                print("async group %s versions=[%d..%d] lag=%d cuts=%d regenerated=%d"
                      % (g.group_id, g.min_policy_version, g.max_policy_version, g.policy_lag or 0, n_cuts,
                         g.regenerated), flush=True)
                train_step(g)
                if received == args.groups:
                    break
                # New weights go in while the other groups keep generating.
                version += 1
                with client.policy_update(stream_id, version, mode=args.mode) as begin:
                    load_weights(args.endpoint, version)
                updates += 1
                print("update v%d mode=%s in_flight=%d pause_ms=%d"
                      % (version, args.mode, begin.in_flight, begin.pause_ms), flush=True)
                stream.credit(1, trainer_version=version)
            last = stream.status
            stream.close()
        if last is not None:
            print("status: policy_version=%d stale_dropped=%d stale_regenerated=%d stale_marked=%d"
                  % (last.policy_version, last.stale_dropped, last.stale_regenerated, last.stale_marked), flush=True)
    for p in problems:
        print("problem: " + p, flush=True)
    print("async: received %d/%d groups, %d updates, %d abort cuts, max lag %d <= %d"
          % (received, args.groups, updates, cuts, max_lag, args.max_staleness), flush=True)
    ok = received == args.groups and not problems and updates == args.groups - 1 and max_lag <= args.max_staleness
    print("OK" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RolloutError as e:
        sys.exit("rpc failed: %s" % e)
