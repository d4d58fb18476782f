"""verl stand-ins (volcengine/verl at b178a3c).

A DataProto-shaped batch (verl/protocol.py: non_tensor_batch of numpy
object arrays, meta_info) as RayPPOTrainer.fit hands it to the agent-loop
manager (verl/trainer/ppo/ray_trainer.py :1375 a uid per prompt, :1445
repeat(n, interleave=True)), and the checks verl's consumers make of
generate_sequences' answer (verl/experimental/agent_loop/agent_loop.py
_postprocess :732-806): [bsz, prompt_length] left-padded prompts,
[bsz, response_length] responses and masks, input_ids = prompts ++
responses, attention_mask covering real tokens, rm_scores holding the
reward on the last response token, __num_turns__ per sample.
"""

from types import SimpleNamespace

import numpy as np


def data_proto(rows, n, global_steps):
    uids = np.array(["uid-%d" % k for k in range(len(rows))], dtype=object)
    items = np.empty(len(rows), dtype=object)
    items[:] = rows
    raw = np.empty(len(rows), dtype=object)
    raw[:] = [[{"role": "user", "content": r.get("question", "")}] for r in rows]
    # repeat(repeat_times=n, interleave=True): each row n times in a row.
    nt = {"uid": np.repeat(uids, n), "rollout_item": np.repeat(items, n), "raw_prompt": np.repeat(raw, n)}
    return SimpleNamespace(non_tensor_batch=nt, meta_info={"global_steps": global_steps, "validate": False})


def check_postprocessed(out, bsz, prompt_length=None, response_length=None):
    b, nt = out["batch"], out["non_tensor_batch"]
    for k in ("prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids", "rm_scores"):
        assert k in b, "missing %s" % k
        assert b[k].shape[0] == bsz, "%s: batch %d, want %d" % (k, b[k].shape[0], bsz)
    pl, rl = b["prompts"].shape[1], b["responses"].shape[1]
    if prompt_length:
        assert pl == prompt_length
    if response_length:
        assert rl == response_length
    assert b["input_ids"].shape[1] == pl + rl
    assert (b["input_ids"] == np.concatenate([b["prompts"], b["responses"]], axis=1)).all()
    assert b["response_mask"].shape == b["responses"].shape
    # response_mask only where attention_mask has a response token.
    assert ((b["response_mask"] == 1) <= (b["attention_mask"][:, pl:] == 1)).all()
    # rm_scores: one reward, on the last response token (agent_loop.py :763-767).
    resp_len = b["attention_mask"][:, pl:].sum(axis=1) - 1
    nonzero = np.count_nonzero(b["rm_scores"], axis=1)
    assert (nonzero <= 1).all()
    for i in range(bsz):
        row = b["rm_scores"][i]
        if nonzero[i]:
            assert row[resp_len[i]] != 0
    assert nt["__num_turns__"].shape == (bsz,)
    if "rollout_log_probs" in b:
        assert b["rollout_log_probs"].shape == b["responses"].shape
        assert (b["rollout_log_probs"][b["response_mask"] == 1] <= 0).all()
    return b, nt
