#!/usr/bin/python3
"""Drive a running `rollout serve` from Python with the rollout-client
package (python/, docs/python.md).

1. Starts a job (StartJob), follows it with WatchJob until it ends and prints
   every completed group: item id, rewards, tokens and trained tokens per
   rollout.
2. Collects groups trainer-style with CollectGroups, granting one credit per
   consumed group so that at most one group is ever in flight.

Both streams ask for the compact token layout (the loss mask as run
lengths, logprobs of trained positions only); the package decodes either
layout into position-aligned columns (rollout.types.Rollout).

Run it with the package installed (pip install ./python) or from a
checkout, where it imports python/ directly. With Debian's python3-grpcio
use /usr/bin/python3: a pyenv or virtualenv python3 does not see Debian's
dist-packages.

    rollout sim --env toolcall-match --port 8000 &
    rollout serve --listen 127.0.0.1:50051 &
    /usr/bin/python3 examples/python/rollout_example.py \\
        --addr 127.0.0.1:50051 --endpoint http://127.0.0.1:8000

See docs/api.md for the API and examples/python/README.md for this script.
"""

import argparse
import os
import sys
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import rollout
except ImportError:  # not installed: the checkout's package
    sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
    import rollout

from rollout import Client, RolloutError  # noqa: E402


def run_config(env, endpoint, groups, group_size, out_dir=None):
    """A run config (docs/config.md). Paths are paths on the server,
    relative to its --data-dir."""
    lines = [
        "env: " + env,
        "groups: %d" % groups,
        "group_size: %d" % group_size,
        "inference:",
        "  backend: vllm",
        "  endpoints: [%s]" % endpoint,
        "parser: hermes",
        "sampling: {max_tokens: 256}",
    ]
    if out_dir:
        lines += ["output:", "  dir: " + out_dir]
    return "\n".join(lines) + "\n"


def describe_group(g):
    """item id, rewards, token and trained token counts of one group
    (rollout.Group), on one line."""
    rewards = ", ".join("%.2f" % r.reward if r.ok else r.status + ":" + r.failure_kind for r in g.rollouts)
    tokens = ", ".join(str(len(r.tokens)) for r in g.rollouts)
    trained = ", ".join(str(sum(r.loss_mask)) for r in g.rollouts)
    line = "item=%s rewards=[%s] tokens=[%s] mean=%.2f trained=[%s]" % (g.item_id, rewards, tokens, g.mean, trained)
    if g.policy_version is not None:
        line += " policy_version=%d" % g.policy_version
    if g.dropped:
        line += " dropped"
    return line


def watch_job(client, args):
    """StartJob, then WatchJob until the job ends. Returns True when the job
    succeeded and every group arrived."""
    out_dir = args.out or "runs/python-example-" + uuid.uuid4().hex[:8]
    job = client.start_job(run_config(args.env, args.endpoint, args.groups, args.group_size, out_dir))
    print("job %s started: env %s, output %s" % (job.id, job.env, job.output_dir), flush=True)

    # Groups that complete before the watch begins are not replayed (the run
    # directory has them), so watch right away; the final progress tells
    # whether any were missed.
    received = 0
    final = None
    for kind, val in client.watch_job(job.id, include_groups=True, timeout=args.timeout):
        if kind == "group":
            received += 1
            print("watch group %s %s" % (val.group_id, describe_group(val)), flush=True)
        elif kind == "progress" and args.verbose:
            print("  progress: %d/%d groups, %d rollouts, mean reward %.2f"
                  % (val.groups_done, val.groups_total, val.rollouts, val.mean_reward), flush=True)
        elif kind == "finished":
            final = val
    if final is None:
        print("watch: the stream ended without the final job", flush=True)
        return False
    pb = rollout.v1.rollout_pb2
    done = final.progress.groups_done
    print("watch: job %s %s, received %d/%d groups, mean reward %.2f%s"
          % (final.id, pb.JobState.Name(final.state), received, done, final.progress.mean_reward,
             (", error: " + final.error) if final.error else ""), flush=True)
    if received < done:
        print("watch: %d groups finished before the watch began (see %s)"
              % (done - received, final.output_dir), flush=True)
    return final.state == pb.JOB_STATE_SUCCEEDED and received == done == args.groups


def collect_groups(client, args):
    """CollectGroups: ask for the next N items of the dataset, one credit at
    a time. Returns True when all N groups arrived."""
    want = args.groups
    max_in_flight = [0]

    def on_status(s):
        max_in_flight[0] = max(max_in_flight[0], s.in_flight)
        if args.verbose:
            print("  status: credits %d, in flight %d, queued %d, sent %d%s"
                  % (s.credits, s.in_flight, s.queued, s.sent, ", exhausted" if s.exhausted else ""), flush=True)

    config = run_config(args.env, args.endpoint, 0, args.group_size)  # no output.dir: stream only
    received = 0
    with client.collect(config, initial_credits=1, timeout=args.timeout, on_status=on_status) as stream:
        stream.next(want, request_id="step-1", policy_version=1)
        while received < want:
            g = stream.get(timeout=args.timeout)
            received += 1
            print("collect group %s request=%s %s" % (g.group_id, g.request_id, describe_group(g)), flush=True)
            # A trainer grants a credit per group it has consumed: the
            # service never runs ahead by more than the credits given.
            if received < want:
                stream.credit(1)
        stream.close()  # half-close: the stream ends once in-flight groups are sent
        for g in stream:
            print("collect: unexpected group %s after the last one" % g.group_id, flush=True)
            received += 1
    print("collect: received %d/%d groups, at most %d in flight" % (received, want, max_in_flight[0]), flush=True)
    return received == want


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--addr", default=os.environ.get("ROLLOUT_ADDR", "127.0.0.1:50051"),
                    help="server address (host:port or unix:PATH)")
    ap.add_argument("--endpoint", default="http://127.0.0.1:8000",
                    help="inference endpoint the jobs use (e.g. `rollout sim --env toolcall-match`)")
    ap.add_argument("--env", default="toolcall-match", help="environment (needs no Docker)")
    ap.add_argument("--groups", type=int, default=3, help="groups to collect in each part")
    ap.add_argument("--group-size", type=int, default=4, help="rollouts per group")
    ap.add_argument("--out", default="", help="job output.dir on the server (default: a fresh runs/python-example-*)")
    ap.add_argument("--auth-token-file", default="", help="bearer token file, when the server needs one")
    ap.add_argument("--wait", type=float, default=60, help="seconds to wait for the server to come up")
    ap.add_argument("--timeout", type=float, default=600, help="deadline of each stream, in seconds")
    ap.add_argument("--skip-watch", action="store_true", help="skip the StartJob/WatchJob part")
    ap.add_argument("--skip-collect", action="store_true", help="skip the CollectGroups part")
    ap.add_argument("-v", "--verbose", action="store_true", help="print progress and status messages too")
    args = ap.parse_args()

    with Client(args.addr, token_file=args.auth_token_file or None) as client:
        client.wait_ready(args.wait)
        v = client.version()
        print("connected to rollout %s (%s) at %s" % (v.version, v.commit, args.addr), flush=True)
        ok = True
        if not args.skip_watch:
            ok = watch_job(client, args) and ok
        if not args.skip_collect:
            ok = collect_groups(client, args) and ok
    print("OK" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RolloutError as e:
        sys.exit("rpc failed: %s" % e)
