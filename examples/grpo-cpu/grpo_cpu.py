#!/usr/bin/python3
"""A closed GRPO loop on CPU: rollout collects, PyTorch trains, llama.cpp serves.

For each step:
  1. ask `rollout serve` for groups over one CollectGroups stream
     (CollectItems stamped with the current policy version, one credit per
     group), sampled by llama-server from the current policy GGUF;
  2. check every rollout's alignment (tokens, loss mask, logprobs) and
     recompute the logprob of every trained token (loss_mask 1) with the
     PyTorch copy of the same weights: |engine - trainer| per token;
  3. take a GRPO step: PPO-clip on tokens x loss mask x advantages, with the
     importance ratio against the recorded behaviour logprobs;
  4. write the new weights to the GGUF the engine serves (same metadata),
     run --reload-cmd (e.g. `docker restart` of the engine), wait for
     /health, check the engine serves the new weights, bump the version.

It fails (non-zero exit, one line saying why) when a rollout is misaligned
(exit 3), when the logprob agreement breaks (p99 |delta| over the trained
tokens of a step above --agreement-tol: exit 2), or when the mean reward
does not rise by --min-rise from the first to the last steps (exit 4).
--corrupt breaks one of tokens, mask, logprobs or advantages on purpose, to
show that these checks catch it.

Writes --out/metrics.json and --out/training-proof.png (reward per step,
histogram of |delta logprob|). See examples/grpo-cpu/README.md.
"""

import argparse
import json
import math
import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
try:
    import rollout
except ImportError:  # not installed: the checkout's package (python/)
    sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
    import rollout

import tiny_qwen3  # noqa: E402
from rollout import Client, RolloutError  # noqa: E402

EXIT_AGREEMENT = 2
EXIT_MISALIGNED = 3
EXIT_NO_RISE = 4
CORRUPTIONS = ("none", "tokens", "mask", "logprobs", "advantages")


class CheckFailed(Exception):
    def __init__(self, code, msg):
        super().__init__(msg)
        self.code = code


# ---------------------------------------------------------------- records


class Rollout:
    """What the trainer uses of one collected rollout."""

    def __init__(self, group_id, index, tokens, mask, logprobs, advantage, reward, policy_version):
        self.group_id = group_id
        self.index = index
        self.tokens = list(tokens)
        self.mask = list(mask)
        self.logprobs = list(logprobs)
        self.advantage = advantage
        self.reward = reward
        self.policy_version = policy_version

    def name(self):
        return "%s[%d]" % (self.group_id, self.index)


def rollouts_of(group):
    """The trainable rollouts of a CollectGroups group: ok, with an
    advantage, in a group that was not dropped."""
    if group.dropped:
        return []
    pv = group.policy_version
    out = []
    for r in group.rollouts:
        if not r.ok or r.advantage is None:
            continue
        # The package expanded the compact token layout the stream uses;
        # logprobs are [] when the engine returned none.
        out.append(Rollout(group.group_id, r.index, r.tokens, r.loss_mask, r.logprobs or [], r.advantage, r.reward, pv))
    return out


def corrupt(rollouts, what):
    """Breaks one field on purpose (the test copy of the data)."""
    for r in rollouts:
        trained = [i for i, m in enumerate(r.mask) if m == 1]
        if what == "tokens":
            # Off by one: every token id moved one position to the left.
            r.tokens = r.tokens[1:] + r.tokens[-1:]
        elif what == "mask":
            # Off by one: the loss mask moved one position to the left, so
            # the token before each sampled turn counts as trained. (Moved
            # right, a single-turn mask only loses its first trained token:
            # consistent data, which no check can call wrong.)
            r.mask = r.mask[1:] + [0]
        elif what == "logprobs":
            # The logprobs of the trained tokens, each paired with the next
            # trained token's (placeholders stay where they are).
            vals = [r.logprobs[i] for i in trained]
            for i, v in zip(trained, vals[1:] + vals[:1]):
                r.logprobs[i] = v
        elif what == "advantages":
            r.advantage = -r.advantage


def check_aligned(r, n_vocab, policy_version):
    """Structural checks; any failure is a misalignment (exit 3)."""
    n = len(r.tokens)
    if n == 0:
        raise CheckFailed(EXIT_MISALIGNED, "%s: no tokens (chat mode?): the trainer needs token ids" % r.name())
    if len(r.mask) != n or len(r.logprobs) != n:
        raise CheckFailed(EXIT_MISALIGNED, "%s: %d tokens, %d mask values, %d logprobs" % (r.name(), n, len(r.mask), len(r.logprobs)))
    if any(m not in (0, 1) for m in r.mask):
        raise CheckFailed(EXIT_MISALIGNED, "%s: loss mask values other than 0 and 1" % r.name())
    if r.mask[0] != 0:
        raise CheckFailed(EXIT_MISALIGNED, "%s: the first token is marked trained" % r.name())
    if not any(r.mask):
        raise CheckFailed(EXIT_MISALIGNED, "%s: no trained token" % r.name())
    bad = [t for t in r.tokens if not 0 <= t < n_vocab]
    if bad:
        raise CheckFailed(EXIT_MISALIGNED, "%s: token id %d outside the vocabulary (%d)" % (r.name(), bad[0], n_vocab))
    for i, m in enumerate(r.mask):
        if m == 1 and not (math.isfinite(r.logprobs[i]) and r.logprobs[i] <= 0):
            raise CheckFailed(EXIT_MISALIGNED, "%s: trained position %d has logprob %r (untrained placeholder or garbage)"
                              % (r.name(), i, r.logprobs[i]))
    if r.policy_version != policy_version:
        raise CheckFailed(EXIT_MISALIGNED, "%s: sampled with policy version %s, the trainer is at %d"
                          % (r.name(), r.policy_version, policy_version))


# ---------------------------------------------------------------- engine


def http_json(url, body=None, timeout=30):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.load(resp)


def wait_healthy(endpoint, timeout):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            if http_json(endpoint + "/health", timeout=5).get("status") == "ok":
                return
        except (urllib.error.URLError, OSError, ValueError) as e:
            last = e
        time.sleep(0.2)
    raise RuntimeError("engine at %s not healthy within %ds (last error: %s)" % (endpoint, timeout, last))


def engine_probe(endpoint, model, prompt_ids):
    """|engine - trainer| logprob of one sampled token on a fixed prompt:
    proves the engine serves the weights the trainer holds."""
    # llama.cpp names no probability for a sampled token that ends inside a
    # UTF-8 sequence (docs/real-engines.md). A trained policy can put nearly
    # all its mass on one at the assistant's first position, so the probe
    # tries a few seeds there, then the same at shorter prefixes of the
    # prompt (positions the training does not sharpen), until the engine
    # names one.
    for cut in range(len(prompt_ids), max(1, len(prompt_ids) - 8), -1):
        prefix = list(prompt_ids[:cut])
        for seed in range(1, 9):
            res = http_json(endpoint + "/completion", {
                "prompt": prefix, "n_predict": 1, "n_probs": 1, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
                "min_p": 0.0, "seed": seed, "cache_prompt": False, "return_tokens": True})
            probs = res.get("completion_probabilities") or []
            if not res.get("tokens") or not probs:
                continue
            tok = res["tokens"][0]
            got = probs[0]["logprob"]
            with torch.no_grad():
                want = float(model.token_logprobs(prefix + [tok])[-1])
            return abs(got - want)
    raise RuntimeError("engine probe: every seed at the prompt's last 8 positions sampled a token the engine names no probability for")


# ---------------------------------------------------------------- gRPC


class Collector:
    """One CollectGroups stream for the whole run."""

    def __init__(self, client, config_yaml, per_step, timeout):
        self.per_step = per_step
        self.timeout = timeout
        self.stream = client.collect(config_yaml, initial_credits=per_step, timeout=timeout)

    def collect(self, step, items, policy_version):
        rid = "step-%d" % step
        if step > 0:
            self.stream.credit(self.per_step)
        self.stream.items(items, request_id=rid, policy_version=policy_version)
        groups = []
        while len(groups) < len(items):
            g = self.stream.get(timeout=self.timeout)
            if g.request_id != rid:
                raise RuntimeError("group %s of request %r arrived during %s" % (g.group_id, g.request_id, rid))
            groups.append(g)
        return groups

    def close(self):
        self.stream.cancel()


def run_config(args):
    lines = [
        "env: " + args.env,
        "groups: 0",
        "group_size: %d" % args.group_size,
        "seed: %d" % args.seed,
        "inference:",
        "  backend: " + args.backend,
        "  endpoints: [%s]" % (args.inference_endpoint or args.endpoint),
        # The engine restarts between steps: a pooled connection to the old
        # process fails once, and the default 5 s backoff and breaker
        # cooldown would stall the next collection.
        "  backoff_max: 200ms",
        "  breaker_cooldown: 500ms",
        "sampling: {temperature: %r, top_p: 1.0, max_tokens: %d}" % (args.temperature, args.max_tokens),
        "parser: hermes",
        "max_turns: 1",
        "retries: 0",
        "limits: {rollouts_in_flight: %d, groups_in_flight: %d}" % (args.group_size * args.groups_per_step, args.groups_per_step),
        "advantage: {mode: grpo}",
    ]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- training


def grpo_step(model, opt, rollouts, args, deltas_out):
    """Agreement on the first pass, then --ppo-epochs PPO-clip passes.
    Returns the trained token count and the step's |delta| values."""
    step_deltas = []
    ntok = sum(sum(r.mask) for r in rollouts)
    for epoch in range(args.ppo_epochs):
        opt.zero_grad()
        for r in rollouts:
            new = model.token_logprobs(r.tokens, args.temperature)
            mask = torch.tensor(r.mask, dtype=torch.float32)
            old = torch.tensor(r.logprobs, dtype=torch.float32)
            if epoch == 0:
                sel = mask.bool()
                step_deltas.extend((new.detach()[sel] - old[sel]).abs().tolist())
            ratio = torch.exp(new - torch.where(mask.bool(), old, new.detach()))
            a = float(r.advantage)
            surr = torch.min(ratio * a, torch.clamp(ratio, 1 - args.clip, 1 + args.clip) * a)
            loss = -(surr * mask).sum() / ntok
            loss.backward()
        if epoch == 0:
            check_agreement(step_deltas, args)
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        opt.step()
    deltas_out.extend(step_deltas)
    return ntok, step_deltas


def check_agreement(deltas, args):
    d = np.asarray(deltas, dtype=np.float64)
    p99 = float(np.quantile(d, 0.99))
    if p99 > args.agreement_tol:
        raise CheckFailed(EXIT_AGREEMENT, "logprob agreement failed: p99 |engine - trainer| = %.3g > %.3g over %d trained tokens "
                          "(max %.3g, %.1f%% above 1e-3)" % (p99, args.agreement_tol, d.size, d.max(), 100 * float((d > 1e-3).mean())))


def summary(deltas):
    d = np.asarray(deltas, dtype=np.float64)
    if d.size == 0:
        return {"tokens": 0, "mean": 0.0, "p50": 0.0, "p99": 0.0, "max": 0.0, "frac_gt_1e-3": 0.0}
    return {
        "tokens": int(d.size),
        "mean": float(d.mean()),
        "p50": float(np.quantile(d, 0.5)),
        "p99": float(np.quantile(d, 0.99)),
        "max": float(d.max()),
        "frac_gt_1e-3": float((d > 1e-3).mean()),
    }


def plot(path, metrics, deltas, args):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    steps = [m["step"] for m in metrics]
    a.plot(steps, [m["mean_reward"] for m in metrics], marker="o")
    a.set_xlabel("step (policy version)")
    a.set_ylabel("mean reward")
    a.set_ylim(-0.02, 1.02)
    a.set_title("GRPO on llama.cpp rollouts (%d x %d per step)" % (args.groups_per_step, args.group_size))
    a.grid(alpha=0.3)
    d = np.maximum(np.asarray(deltas, dtype=np.float64), 1e-12)
    bins = np.logspace(-12, 1, 53)
    b.hist(d, bins=bins)
    b.set_xscale("log")
    b.axvline(1e-3, color="red", linestyle="--", label="1e-3")
    b.set_xlabel("|engine - trainer| logprob per trained token (0 drawn at 1e-12)")
    b.set_ylabel("tokens")
    s = summary(deltas)
    b.set_title("%d tokens, p99 %.1e, max %.1e" % (s["tokens"], s["p99"], s["max"]))
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def items_for(step, args):
    return [{"id": "p%d" % i, "prompt": args.prompt} for i in range(args.groups_per_step)]


def run(args):
    t0 = time.time()
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    torch.set_num_threads(args.threads)
    model = tiny_qwen3.load(args.policy, kv_f16=args.kv_f16)
    n_vocab = model.cfg.n_vocab
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    os.makedirs(args.out, exist_ok=True)
    probe_ids = http_json(args.endpoint + "/tokenize", {"content": "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n",
                                                         "add_special": False})["tokens"]
    d0 = engine_probe(args.endpoint, model, probe_ids)
    print("engine serves %s: probe |delta| %.2e" % (args.policy, d0), flush=True)
    if d0 > args.agreement_tol:
        raise CheckFailed(EXIT_AGREEMENT, "the engine does not serve the trainer's weights before training: probe |delta| %.3g" % d0)

    metrics, deltas = [], []
    unscored_total = 0
    with Client(args.addr) as client:
        client.wait_ready(60)
        col = Collector(client, run_config(args), args.groups_per_step, args.timeout)
        try:
            for step in range(args.steps):
                ts = time.time()
                version = step
                groups = col.collect(step, items_for(step, args), version)
                tc = time.time() - ts
                rewards = [r.reward for g in groups for r in g.rollouts if r.status == "ok"]
                failed = sum(1 for g in groups for r in g.rollouts if r.status != "ok")
                # Sampled ids the engine gave no logprob (untrained):
                # rollout's llama.cpp scoring pass leaves none.
                unscored_total += sum(r.raw.unscored_tokens for g in groups for r in g.rollouts if r.ok)
                if not rewards:
                    bad = [r for g in groups for r in g.rollouts]
                    raise RuntimeError("step %d: no rollout succeeded (%d failed; first: %s: %s)"
                                       % (step, len(bad), bad[0].failure_kind if bad else "-",
                                          bad[0].failure_message if bad else "no rollouts"))
                rollouts = [r for g in groups for r in rollouts_of(g)]
                if args.corrupt != "none":
                    corrupt(rollouts, args.corrupt)
                for r in rollouts:
                    check_aligned(r, n_vocab, version)
                mean_reward = float(np.mean(rewards)) if rewards else 0.0
                if not rollouts:
                    # Every group had equal rewards: nothing to learn from.
                    ntok, sd = 0, []
                else:
                    ntok, sd = grpo_step(model, opt, rollouts, args, deltas)
                tt = time.time() - ts - tc
                tiny_qwen3.save(model, args.policy)
                if args.reload_cmd:
                    subprocess.run(args.reload_cmd, shell=True, check=True, stdout=subprocess.DEVNULL)
                wait_healthy(args.endpoint, args.reload_timeout)
                probe = engine_probe(args.endpoint, model, probe_ids)
                if probe > args.agreement_tol:
                    raise CheckFailed(EXIT_AGREEMENT, "after step %d the engine does not serve the new weights: probe |delta| %.3g" % (step, probe))
                m = {"step": step, "policy_version": version, "mean_reward": mean_reward, "rollouts": len(rewards),
                     "infra_failed": failed, "trained_rollouts": len(rollouts), "trained_tokens": ntok,
                     "collect_s": round(tc, 3), "train_s": round(tt, 3), "reload_s": round(time.time() - ts - tc - tt, 3),
                     "probe_delta": probe}
                if sd:
                    m["agreement"] = summary(sd)
                metrics.append(m)
                print("step %d policy_version=%d mean_reward=%.3f rollouts=%d trained_tokens=%d p99_delta=%.2e "
                      "collect=%.1fs train=%.1fs reload=%.1fs"
                      % (step, version, mean_reward, len(rewards), ntok, m.get("agreement", {}).get("p99", 0.0),
                         tc, tt, m["reload_s"]), flush=True)
        finally:
            col.close()

    wall = time.time() - t0
    k = max(1, min(args.window, args.steps // 2))
    first = float(np.mean([m["mean_reward"] for m in metrics[:k]]))
    last = float(np.mean([m["mean_reward"] for m in metrics[-k:]]))
    agreement = summary(deltas)
    report = {"steps": metrics, "agreement": agreement, "reward_first": first, "reward_last": last,
              "window": k, "wall_s": round(wall, 1), "corrupt": args.corrupt,
              "config": {kk: v for kk, v in vars(args).items() if kk not in ("reload_cmd",)}}
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(report, f, indent=1)
    plot(os.path.join(args.out, "training-proof.png"), metrics, deltas, args)
    print("AGREEMENT tokens=%d p50=%.2e p99=%.2e max=%.2e frac_gt_1e-3=%.4f"
          % (agreement["tokens"], agreement["p50"], agreement["p99"], agreement["max"], agreement["frac_gt_1e-3"]), flush=True)
    print("REWARD first=%.3f last=%.3f (mean of %d steps each)" % (first, last, k), flush=True)
    print("UNSCORED %d" % unscored_total, flush=True)
    print("WALL %.1fs" % wall, flush=True)
    if last - first < args.min_rise:
        raise CheckFailed(EXIT_NO_RISE, "mean reward did not rise: first %.3f, last %.3f, want a rise of at least %.3f"
                          % (first, last, args.min_rise))
    print("OK", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--addr", required=True, help="rollout serve address (host:port)")
    ap.add_argument("--endpoint", required=True, help="llama-server base URL (the engine rollout samples from)")
    ap.add_argument("--policy", required=True, help="the GGUF the engine serves: read at start, rewritten after every step")
    ap.add_argument("--inference-endpoint", default="",
                    help="the endpoint rollout's backend uses (default: --endpoint)")
    ap.add_argument("--reload-cmd", default="", help="shell command that makes the engine load --policy again (e.g. docker restart NAME)")
    ap.add_argument("--reload-timeout", type=float, default=120, help="seconds to wait for the engine's /health after a reload")
    ap.add_argument("--env", default=os.path.join(HERE, "digits.yaml"), help="env (a registered name or a YAML env path on the server)")
    ap.add_argument("--backend", default="llamacpp", help="rollout inference backend")
    ap.add_argument("--prompt", default="Write digits.", help="the user prompt of every item")
    ap.add_argument("--out", required=True, help="directory for metrics.json and training-proof.png")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--groups-per-step", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=5e-3)
    ap.add_argument("--ppo-epochs", type=int, default=2)
    ap.add_argument("--clip", type=float, default=0.2)
    ap.add_argument("--max-grad-norm", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--kv-f16", action="store_true",
                    help="emulate an engine with llama.cpp's default float16 KV cache (default: the engine runs -ctk f32 -ctv f32 -fa off)")
    ap.add_argument("--agreement-tol", type=float, default=1e-3, help="maximum p99 |engine - trainer| logprob")
    ap.add_argument("--min-rise", type=float, default=0.2, help="required rise of the mean reward, first to last steps")
    ap.add_argument("--window", type=int, default=2, help="steps averaged at each end for the rise")
    ap.add_argument("--corrupt", choices=CORRUPTIONS, default="none", help="break one field on purpose (tests)")
    ap.add_argument("--timeout", type=float, default=1200, help="deadline of the CollectGroups stream, seconds")
    args = ap.parse_args()
    if args.temperature != 1.0:
        # llama-server's n_probs logprobs are a softmax of the raw logits
        # (post_sampling_probs off): they equal the sampling distribution
        # only at temperature 1 with the neutral sampler.
        ap.error("--temperature: only 1.0 is supported (see README.md)")
    try:
        run(args)
    except CheckFailed as e:
        print("FAILED: " + str(e), flush=True)
        return e.code
    except RolloutError as e:
        print("ERROR: rollout serve: %s" % e, flush=True)
        return 1
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        print("ERROR: %s" % e, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
