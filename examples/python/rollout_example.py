#!/usr/bin/python3
"""Drive a running `rollout serve` from Python.

1. Generates the gRPC stubs from proto/rollout/v1/rollout.proto with
   grpcio-tools into a temporary directory (nothing is written to the tree).
2. Starts a job (StartJob), follows it with WatchJob until it ends and prints
   every completed group: item id, rewards, tokens and trained tokens per
   rollout.
3. Collects groups trainer-style with CollectGroups, granting one credit per
   consumed group so that at most one group is ever in flight.

Both streams ask for the compact token layout (TOKEN_LAYOUT_COMPACT: the loss
mask as run lengths, logprobs of trained positions only); full_token_columns()
turns a rollout of either layout into position-aligned loss_mask and
logprobs lists.

Needs python3-grpcio and python3-grpc-tools (Debian) or grpcio and
grpcio-tools (PyPI). With Debian's packages run it with /usr/bin/python3: a
pyenv or virtualenv python3 does not see Debian's dist-packages.

    rollout sim --env toolcall-match --port 8000 &
    rollout serve --listen 127.0.0.1:50051 &
    /usr/bin/python3 examples/python/rollout_example.py \\
        --addr 127.0.0.1:50051 --endpoint http://127.0.0.1:8000

See docs/api.md for the API and examples/python/README.md for this script.
"""

import argparse
import importlib
import os
import queue
import re
import subprocess
import sys
import tempfile
import uuid

import grpc

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_PROTO_ROOT = os.path.normpath(os.path.join(HERE, "..", "..", "proto"))
PROTO = "rollout/v1/rollout.proto"

# `optional T name = N;` (proto3 explicit presence) as the equivalent
# synthetic oneof, for protoc releases older than 3.15 (e.g. Debian
# bookworm's python3-grpc-tools 1.14): same wire format, and HasField()
# still tells set from unset.
OPTIONAL_FIELD = re.compile(r"^(\s*)optional\s+([\w.]+)\s+(\w+)\s*=\s*(\d+)\s*([^;]*);", re.M)


def generate_stubs(proto_root, out_dir):
    """Compiles rollout/v1/rollout.proto under proto_root into out_dir and
    returns the (rollout_pb2, rollout_pb2_grpc) modules."""
    import grpc_tools

    well_known = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")

    def protoc(include):
        cmd = [sys.executable, "-m", "grpc_tools.protoc", "-I", include, "-I", well_known,
               "--python_out", out_dir, "--grpc_python_out", out_dir, os.path.join(include, PROTO)]
        return subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              universal_newlines=True)

    res = protoc(proto_root)
    if res.returncode != 0 and "optional" in res.stdout:
        # An old protoc: rewrite the optional fields and compile again.
        with open(os.path.join(proto_root, PROTO)) as f:
            text = OPTIONAL_FIELD.sub(r"\1oneof _\3 { \2 \3 = \4 \5; }", f.read())
        src = os.path.join(out_dir, "_src")
        os.makedirs(os.path.join(src, os.path.dirname(PROTO)))
        with open(os.path.join(src, PROTO), "w") as f:
            f.write(text)
        res = protoc(src)
    if res.returncode != 0:
        sys.exit("grpc_tools.protoc failed:\n" + res.stdout)
    sys.path.insert(0, out_dir)
    return (importlib.import_module("rollout.v1.rollout_pb2"),
            importlib.import_module("rollout.v1.rollout_pb2_grpc"))


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


LOGPROB_PLACEHOLDER = 1.0  # the logprob of an untrained position


def full_token_columns(r):
    """(loss_mask, logprobs) of a rollout as lists aligned with r.tokens, from
    either token layout (docs/api.md, "Token layout"). logprobs is [] when
    the rollout has none. Raises ValueError on inconsistent fields."""
    n = len(r.tokens)
    if r.loss_mask_runs:
        if r.loss_mask:
            raise ValueError("rollout %d: both loss_mask and loss_mask_runs" % r.index)
        if any(k < 0 for k in r.loss_mask_runs) or sum(r.loss_mask_runs) != n:
            raise ValueError("rollout %d: loss_mask_runs %s do not cover its %d tokens" % (r.index, list(r.loss_mask_runs), n))
        mask = []
        for i, k in enumerate(r.loss_mask_runs):
            mask.extend([i % 2] * k)
    else:
        mask = list(r.loss_mask)
    if r.trained_logprobs:
        if r.logprobs:
            raise ValueError("rollout %d: both logprobs and trained_logprobs" % r.index)
        if sum(mask) != len(r.trained_logprobs):
            raise ValueError("rollout %d: %d trained_logprobs for %d trained positions"
                             % (r.index, len(r.trained_logprobs), sum(mask)))
        it = iter(r.trained_logprobs)
        logprobs = [next(it) if m else LOGPROB_PLACEHOLDER for m in mask]
    else:
        logprobs = list(r.logprobs)
    if len(mask) != n or logprobs and len(logprobs) != n:
        raise ValueError("rollout %d: %d tokens, %d mask values, %d logprobs" % (r.index, n, len(mask), len(logprobs)))
    return mask, logprobs


def describe_group(g):
    """item id, rewards, token and trained token counts of one group, on
    one line."""
    rewards = ", ".join("%.2f" % r.reward if r.status == "ok" else r.status + ":" + r.failure_kind
                        for r in g.rollouts)
    tokens = ", ".join(str(len(r.tokens)) for r in g.rollouts)
    trained = ", ".join(str(sum(full_token_columns(r)[0])) for r in g.rollouts)
    line = "item=%s rewards=[%s] tokens=[%s] mean=%.2f trained=[%s]" % (g.item_id, rewards, tokens, g.mean, trained)
    if g.HasField("policy_version"):
        line += " policy_version=%d" % g.policy_version
    if g.dropped:
        line += " dropped"
    return line


def watch_job(pb, stub, args, meta):
    """StartJob, then WatchJob until the job ends. Returns True when the job
    succeeded and every group arrived."""
    out_dir = args.out or "runs/python-example-" + uuid.uuid4().hex[:8]
    config = run_config(args.env, args.endpoint, args.groups, args.group_size, out_dir)
    job = stub.StartJob(pb.StartJobRequest(config_yaml=config), metadata=meta, timeout=30).job
    print("job %s started: env %s, output %s" % (job.id, job.env, job.output_dir), flush=True)

    # Groups that complete before the watch begins are not replayed (the run
    # directory has them), so watch right away; the final progress tells
    # whether any were missed.
    received = 0
    final = None
    events = stub.WatchJob(pb.WatchJobRequest(job_id=job.id, include_groups=True,
                                                 token_layout=pb.TOKEN_LAYOUT_COMPACT),
                           metadata=meta, timeout=args.timeout)
    for ev in events:
        kind = ev.WhichOneof("event")
        if kind == "group":
            received += 1
            print("watch group %s %s" % (ev.group.group_id, describe_group(ev.group)), flush=True)
        elif kind == "progress":
            p = ev.progress
            if args.verbose:
                print("  progress: %d/%d groups, %d rollouts, mean reward %.2f"
                      % (p.groups_done, p.groups_total, p.rollouts, p.mean_reward), flush=True)
        elif kind == "finished":
            final = ev.finished
    if final is None:
        print("watch: the stream ended without the final job", flush=True)
        return False
    done = final.progress.groups_done
    print("watch: job %s %s, received %d/%d groups, mean reward %.2f%s"
          % (final.id, pb.JobState.Name(final.state), received, done, final.progress.mean_reward,
             (", error: " + final.error) if final.error else ""), flush=True)
    if received < done:
        print("watch: %d groups finished before the watch began (see %s)"
              % (done - received, final.output_dir), flush=True)
    return final.state == pb.JOB_STATE_SUCCEEDED and received == done == args.groups


def collect_groups(pb, stub, args, meta):
    """CollectGroups: ask for the next N items of the dataset, one credit at
    a time. Returns True when all N groups arrived."""
    want = args.groups
    outbox = queue.Queue()  # requests to send; None closes our side

    def requests():
        while True:
            msg = outbox.get()
            if msg is None:
                return
            yield msg

    config = run_config(args.env, args.endpoint, 0, args.group_size)  # no output.dir: stream only
    outbox.put(pb.CollectGroupsRequest(start=pb.CollectStart(config_yaml=config, initial_credits=1,
                                                                   token_layout=pb.TOKEN_LAYOUT_COMPACT)))
    outbox.put(pb.CollectGroupsRequest(next=pb.CollectNext(request_id="step-1", count=want, policy_version=1)))
    received = 0
    max_in_flight = 0
    closed = False
    try:
        for resp in stub.CollectGroups(requests(), metadata=meta, timeout=args.timeout):
            kind = resp.WhichOneof("msg")
            if kind == "status":
                s = resp.status
                max_in_flight = max(max_in_flight, s.in_flight)
                if args.verbose:
                    print("  status: credits %d, in flight %d, queued %d, sent %d%s"
                          % (s.credits, s.in_flight, s.queued, s.sent, ", exhausted" if s.exhausted else ""),
                          flush=True)
                if s.exhausted and s.in_flight == 0 and s.queued == 0 and not closed:
                    closed = True  # the dataset ran out: nothing more will come
                    outbox.put(None)
            elif kind == "group":
                received += 1
                print("collect group %s request=%s %s"
                      % (resp.group.group_id, resp.group.request_id, describe_group(resp.group)), flush=True)
                # A trainer grants a credit per group it has consumed: the
                # service never runs ahead by more than the credits given.
                if received < want:
                    outbox.put(pb.CollectGroupsRequest(credit=pb.CollectCredit(groups=1)))
                elif not closed:
                    closed = True  # half-close: the stream ends once in-flight groups are sent
                    outbox.put(None)
    finally:
        outbox.put(None)  # ends the request iterator on errors too
    print("collect: received %d/%d groups, at most %d in flight" % (received, want, max_in_flight), flush=True)
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
    ap.add_argument("--proto-root", default=DEFAULT_PROTO_ROOT, help="directory holding " + PROTO)
    ap.add_argument("--auth-token-file", default="", help="bearer token file, when the server needs one")
    ap.add_argument("--wait", type=float, default=60, help="seconds to wait for the server to come up")
    ap.add_argument("--timeout", type=float, default=600, help="deadline of each stream, in seconds")
    ap.add_argument("--skip-watch", action="store_true", help="skip the StartJob/WatchJob part")
    ap.add_argument("--skip-collect", action="store_true", help="skip the CollectGroups part")
    ap.add_argument("-v", "--verbose", action="store_true", help="print progress and status messages too")
    args = ap.parse_args()

    meta = []
    if args.auth_token_file:
        with open(args.auth_token_file) as f:
            meta.append(("authorization", "Bearer " + f.read().strip()))

    with tempfile.TemporaryDirectory(prefix="rollout-stubs-") as stubs:
        pb, rpc = generate_stubs(args.proto_root, stubs)
        channel = grpc.insecure_channel(args.addr, options=[
            # gRPC's default 4 MiB is below a large group.
            ("grpc.max_receive_message_length", 64 << 20),
        ])
        with channel:
            grpc.channel_ready_future(channel).result(timeout=args.wait)
            stub = rpc.RolloutServiceStub(channel)
            v = stub.GetVersion(pb.GetVersionRequest(), metadata=meta, timeout=30)
            print("connected to rollout %s (%s) at %s" % (v.version, v.commit, args.addr), flush=True)
            ok = True
            if not args.skip_watch:
                ok = watch_job(pb, stub, args, meta) and ok
            if not args.skip_collect:
                ok = collect_groups(pb, stub, args, meta) and ok
    print("OK" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except grpc.RpcError as e:
        sys.exit("rpc failed: %s: %s" % (e.code().name, e.details()))
    except grpc.FutureTimeoutError:
        sys.exit("the server did not answer within --wait seconds")
