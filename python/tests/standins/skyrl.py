"""SkyRL stand-ins (NovaSky-AI/SkyRL at a956457).

The types of skyrl/train/generators/base.py (TrajectoryID, BatchMetadata,
GeneratorInput) and the trainer's checks of a generator's answer,
validate_generator_output in skyrl/train/utils/trainer_utils.py (:672):
one response per prompt, every per-sample column as long as response_ids,
loss masks and logprobs aligned with each response, at least one trained
token. The trainer repeats each prompt n_samples_per_prompt times in a row
with trajectory ids (instance_id, repetition_id).
"""

import asyncio
from dataclasses import dataclass


@dataclass
class TrajectoryID:
    instance_id: str
    repetition_id: int

    def to_string(self):
        return "%s_%d" % (self.instance_id, self.repetition_id)


@dataclass
class BatchMetadata:
    global_step: int
    training_phase: str


def generator_input(rows, n_samples_per_prompt, global_step, env_class="toolcall-match"):
    prompts, env_classes, env_extras, traj = [], [], [], []
    for k, row in enumerate(rows):
        for rep in range(n_samples_per_prompt):
            prompts.append([{"role": "user", "content": row.get("question", "")}])
            env_classes.append(env_class)
            env_extras.append(row)
            traj.append(TrajectoryID(instance_id="uid-%d" % k, repetition_id=rep))
    return {"prompts": prompts, "env_classes": env_classes, "env_extras": env_extras,
            "sampling_params": {"temperature": 1.0, "max_generate_length": 24}, "trajectory_ids": traj,
            "batch_metadata": BatchMetadata(global_step=global_step, training_phase="train")}


def validate_generator_output(num_prompts, out):
    if len(out["response_ids"]) <= 0:
        raise RuntimeError("No outputs generated")
    n = len(out["response_ids"])
    assert num_prompts == n, "Mismatch between prompts (%d) and responses (%d)" % (num_prompts, n)
    assert n == len(out["prompt_token_ids"])
    for key in ("response_ids", "loss_masks", "rewards", "rollout_logprobs", "stop_reasons", "trajectory_ids",
                "rollout_expert_indices", "is_last_step", "pixel_values", "image_grid_thw"):
        if isinstance(out.get(key), list):
            assert len(out[key]) == n, "Generator output %s length must be equal to response_ids length" % key
    for i, (resp, mask, reward) in enumerate(zip(out["response_ids"], out["loss_masks"], out["rewards"])):
        assert len(resp) == len(mask), "sample %d: response ids and loss masks differ in length" % i
        if isinstance(reward, list):
            assert len(reward) == len(resp)
        if out["rollout_logprobs"]:
            assert len(resp) == len(out["rollout_logprobs"][i])
    assert sum(sum(m) for m in out["loss_masks"]) > 0, "all outputs are loss masked"
    assert all(isinstance(r, float) for r in out["rewards"])
    # Every GeneratorOutput key of base.py, no other.
    keys = {"prompt_token_ids", "response_ids", "rewards", "loss_masks", "stop_reasons", "rollout_metrics",
            "rollout_logprobs", "trajectory_ids", "trajectory_generation_times", "trajectory_time_splits",
            "rollout_expert_indices", "is_last_step", "env_metrics", "pixel_values", "image_grid_thw"}
    assert set(out) == keys, "GeneratorOutput keys: extra %s, missing %s" % (set(out) - keys, keys - set(out))


class SkyRLTrainerStandIn:
    """Calls the generator as SkyRL's trainer loop does: an awaited
    generate() per step, then validate_generator_output."""

    def __init__(self, generator, n_samples_per_prompt):
        self.generator = generator
        self.n = n_samples_per_prompt
        self.global_step = 0

    def step(self, rows):
        self.global_step += 1
        inp = generator_input(rows, self.n, self.global_step)
        out = asyncio.run(self.generator.generate(inp))
        validate_generator_output(len(inp["prompts"]), out)
        return inp, out
