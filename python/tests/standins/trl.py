"""TRL stand-ins (huggingface/trl at f2cd577, 1.10.0.dev0).

GRPOTrainerStandIn follows GRPOTrainer._generate_and_score_completions with
a rollout_func (trl/trainer/grpo_trainer.py :2150-2245, :2376-2426,
:1612-1690, :2661-2690): required keys, env_mask as the tool mask, left
padded prompts, EOS-truncated completion masks, extra keys merged into the
inputs and passed to reward functions, None rewards as NaN, advantages by
group of num_generations.

AsyncGRPOTrainerStandIn follows AsyncGRPOTrainer's use of a rollout worker
(trl/experimental/async_grpo/async_grpo_trainer.py: RolloutWorkerProtocol
:62-96, RolloutQueueDataset.__iter__ :257-300, _sync_weight :1120-1145,
_inner_training_loop :1147-1155): start, drain rollout_buffer with
check_health on every empty poll, drop samples staler than max_staleness,
weight sync as pause → send_weights → resume → update_model_version, stop.
"""

import math
import queue
import time
from types import SimpleNamespace


class GRPOTrainerStandIn:
    def __init__(self, rollout_func, reward_funcs, num_generations, eos_token_id=2, pad_token_id=0):
        self.rollout_func = rollout_func
        self.reward_funcs = reward_funcs
        self.num_generations = num_generations
        self.args = SimpleNamespace(num_generations=num_generations, use_vllm=False)
        self.state = SimpleNamespace(global_step=0)
        self.processing_class = SimpleNamespace(eos_token_id=eos_token_id, pad_token_id=pad_token_id)
        self._tokenizer = self.processing_class

    def step(self, rows):
        """One generation step over dataset rows (one per prompt); returns
        what the loss needs. RepeatSampler repeats each row num_generations
        times in a row."""
        inputs = [dict(r) for r in rows for _ in range(self.num_generations)]
        prompts = [x["prompt"] for x in inputs]
        output = self.rollout_func(prompts, self)
        required = {"prompt_ids", "completion_ids", "logprobs"}
        missing = required - output.keys()
        if missing:
            raise ValueError("rollout_func must return keys %s in its output dict." % sorted(missing))
        extra = {k: v for k, v in output.items() if k not in required}
        prompt_ids, completion_ids, logprobs = output["prompt_ids"], output["completion_ids"], output["logprobs"]
        tool_mask = extra.pop("env_mask", None)
        n = len(inputs)
        for name, col in (("prompt_ids", prompt_ids), ("completion_ids", completion_ids)):
            if len(col) != n:
                raise ValueError("%s: %d rows for %d prompts" % (name, len(col), n))
        tok = self._tokenizer
        # :2238 a row counts as finished only if its last id is EOS or pad.
        is_truncated = [ids[-1] not in (tok.eos_token_id, tok.pad_token_id) for ids in completion_ids]
        # :2376-2385 prompts left-padded with the pad id.
        width = max(len(p) for p in prompt_ids)
        padded_prompts = [[tok.pad_token_id] * (width - len(p)) + list(p) for p in prompt_ids]
        prompt_mask = [[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids]
        # Completions right-padded; the mask stops after the first EOS (:1869-1873).
        cwidth = max(len(c) for c in completion_ids)
        completion_mask = []
        for ids in completion_ids:
            eos = next((i for i, t in enumerate(ids) if t == tok.eos_token_id), len(ids))
            completion_mask.append([1 if i <= eos and i < len(ids) else 0 for i in range(cwidth)])
        if tool_mask is not None:
            for i, (m, ids) in enumerate(zip(tool_mask, completion_ids)):
                if len(m) != len(ids):
                    raise ValueError("env_mask row %d: %d values for %d completion ids" % (i, len(m), len(ids)))
            tool_mask = [list(m) + [0] * (cwidth - len(m)) for m in tool_mask]
            loss_mask = [[a * b for a, b in zip(c, t)] for c, t in zip(completion_mask, tool_mask)]
        else:
            loss_mask = completion_mask
        if logprobs is not None:
            for i, (lp, ids) in enumerate(zip(logprobs, completion_ids)):
                if len(lp) != len(ids):
                    raise ValueError("logprobs row %d: %d values for %d completion ids" % (i, len(lp), len(ids)))
        # :2661 extra fields merged into the inputs.
        for i, inp in enumerate(inputs):
            for key, values in extra.items():
                if isinstance(values, list) and i < len(values):
                    inp[key] = values[i]
                elif not isinstance(values, list):
                    inp[key] = values
        # :1612 reward kwargs are the inputs' other columns.
        keys = [k for k in inputs[0] if k not in ("prompt", "completion", "completion_ids")]
        kwargs = {k: [ex[k] for ex in inputs] for k in keys}
        kwargs["trainer_state"] = self.state
        completions = [[{"role": "assistant", "content": ""}] for _ in completion_ids]
        per_func = []
        for f in self.reward_funcs:
            out = f(prompts=prompts, completions=completions, completion_ids=completion_ids, **kwargs)
            per_func.append([math.nan if r is None else float(r) for r in out])
        rewards = [sum(x for x in col if not math.isnan(x)) if any(not math.isnan(x) for x in col) else math.nan
                   for col in zip(*per_func)]
        advantages = []
        g = self.num_generations
        for k in range(0, n, g):
            grp = [r for r in rewards[k:k + g] if not math.isnan(r)]
            mean = sum(grp) / len(grp) if grp else 0.0
            advantages += [(r - mean) if not math.isnan(r) else 0.0 for r in rewards[k:k + g]]
        self.state.global_step += 1
        return {"prompt_ids": padded_prompts, "prompt_mask": prompt_mask, "completion_mask": completion_mask,
                "loss_mask": loss_mask, "is_truncated": is_truncated, "rewards": rewards,
                "advantages": advantages, "inputs": inputs, "logprobs": logprobs}


class AsyncGRPOTrainerStandIn:
    def __init__(self, rollout_worker, weight_transfer, max_staleness=1, stale_after_s=120.0, poll_interval_s=0.5):
        for name in ("rollout_buffer", "start", "stop", "update_model_version", "check_health"):
            if not hasattr(rollout_worker, name):
                raise TypeError("rollout_worker lacks %s (RolloutWorkerProtocol)" % name)
        self.worker = rollout_worker
        self.weight_transfer = weight_transfer
        self.max_staleness = max_staleness
        self.stale_after_s = stale_after_s
        self.poll_interval_s = poll_interval_s
        self.model_version = 0
        self.dropped_stale = 0

    def _samples(self):
        q = self.worker.rollout_buffer
        while True:
            while True:
                try:
                    sample = q.get(timeout=self.poll_interval_s)
                    break
                except queue.Empty:
                    self.worker.check_health(self.stale_after_s)
            if self.model_version - sample.model_version > self.max_staleness:
                self.dropped_stale += 1
                continue
            yield {"input_ids": sample.input_ids, "completion_mask": sample.completion_mask,
                   "old_log_probs": sample.old_log_probs, "advantage": sample.advantage,
                   "group_id": sample.group_id, "metrics": dict(sample.metrics),
                   "model_version": sample.model_version}

    def _sync_weight(self):
        self.weight_transfer.pause()
        self.weight_transfer.send_weights(iter([("w", 0)]))
        self.weight_transfer.resume()
        self.model_version += 1
        self.worker.update_model_version(self.model_version)

    def train(self, steps, samples_per_step, weight_sync_steps=1):
        """Runs `steps` optimizer steps of `samples_per_step` samples each;
        returns the samples seen, per step."""
        self.weight_transfer.init_weight_transfer()
        self.worker.start()
        seen = []
        try:
            it = self._samples()
            for step in range(1, steps + 1):
                batch = [next(it) for _ in range(samples_per_step)]
                for s in batch:
                    if len(s["input_ids"]) != len(s["completion_mask"]) or len(s["input_ids"]) != len(s["old_log_probs"]):
                        raise ValueError("sample columns differ in length")
                seen.append(batch)
                time.sleep(0.05)  # the optimizer step
                if step % weight_sync_steps == 0:
                    self._sync_weight()
        finally:
            self.worker.stop()
            self.weight_transfer.destroy()
        return seen
