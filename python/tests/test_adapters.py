"""Each adapter driven by a stand-in of its trainer (tests/standins), against
a real `rollout serve` and the real llama.cpp engine."""

import json
import math
import unittest

import rollout
from rollout.adapters import skyrl as skyrl_adapter
from rollout.adapters import trl as trl_adapter
from rollout.adapters import verl as verl_adapter
from rollout.adapters._common import AdapterError

import live
from standins import skyrl as skyrl_standin
from standins import trl as trl_standin
from standins import verl as verl_standin


class Adapters(live.LiveCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.n = cls.group_size

    def test_trl_rollout_func(self):
        rf = trl_adapter.RolloutFunc(self.client, self.config, timeout=300)
        self.addCleanup(rf.close)
        trainer = trl_standin.GRPOTrainerStandIn(rf, [trl_adapter.env_reward], self.n)
        its = live.items(2)
        # TRL rows hold the prompt; here the env item as JSON text.
        for step in range(2):
            out = trainer.step([{"prompt": json.dumps(it)} for it in its])
            rows = 2 * self.n
            self.assertEqual(len(out["rewards"]), rows)
            self.assertEqual([i["rollout_group_id"] for i in out["inputs"]][::self.n],
                             [g.group_id for g in rf.last_groups])
            for r, inp in zip(out["rewards"], out["inputs"]):
                self.assertFalse(math.isnan(r))
                self.assertEqual(r, inp["rollout_reward"])
            self.assertTrue(any(sum(m) for m in out["loss_mask"]))
            # The step is stamped as the groups' policy version.
            self.assertEqual({g.policy_version for g in rf.last_groups}, {step})
            # Item order survives: group k is prompt k's.
            self.assertEqual([g.item_id.split("/", 1)[1] for g in rf.last_groups],
                             ["0-" + its[0]["id"], "1-" + its[1]["id"]])

    def test_trl_rollout_func_refuses_bad_batches(self):
        rf = trl_adapter.RolloutFunc(self.client, self.config)
        self.addCleanup(rf.close)
        trainer = trl_standin.GRPOTrainerStandIn(rf, [trl_adapter.env_reward], self.n)
        with self.assertRaises(AdapterError) as cm:
            rf(["plain text"] * self.n, trainer)
        self.assertIn("to_item", str(cm.exception))
        with self.assertRaises(AdapterError):
            rf([json.dumps(live.items(1)[0])] * (self.n + 1), trainer)
        # A run config whose group_size is not num_generations.
        other = trl_standin.GRPOTrainerStandIn(rf, [trl_adapter.env_reward], self.n + 1)
        with self.assertRaises(AdapterError) as cm:
            rf([json.dumps(live.items(1)[0])] * (self.n + 1), other)
        self.assertIn("group_size", str(cm.exception))

    def test_trl_async_worker(self):
        cfg = self.config + "async: {max_staleness: 1, on_stale: regenerate}\n"
        worker = trl_adapter.AsyncRolloutWorker(self.client, cfg, max_inflight_groups=2, queue_maxsize=4 * self.n)
        transfer = trl_adapter.PolicyUpdateTransfer(self.client, worker, mode="wait")
        trainer = trl_standin.AsyncGRPOTrainerStandIn(worker, transfer, max_staleness=1)
        seen = trainer.train(steps=3, samples_per_step=self.n)
        self.assertEqual(trainer.model_version, 3)
        samples = [s for step in seen for s in step]
        self.assertEqual(len(samples), 3 * self.n)
        for s in samples:
            self.assertGreater(sum(s["completion_mask"]), 0)
            self.assertEqual(len(s["old_log_probs"]), len(s["input_ids"]))
            self.assertTrue(all(lp <= 0 for lp, m in zip(s["old_log_probs"], s["completion_mask"]) if m))
        # Samples after the first sync come from version >= 1 engines or
        # within the staleness bound.
        last = seen[-1]
        self.assertTrue(all(trainer.model_version - 1 - s["model_version"] <= 1 for s in last))
        # stop() ended the worker: its thread is gone and check_health says so only on failure.
        self.assertFalse(worker._thread.is_alive())

    def test_trl_worker_epoch_ends_with_the_dataset(self):
        # toolcall-match's train split has 7 items: one epoch is 7 groups,
        # then check_health says the worker is done.
        worker = trl_adapter.AsyncRolloutWorker(self.client, self.config, max_inflight_groups=3, epochs=1)
        worker.start()
        worker._thread.join(300)
        self.assertFalse(worker._thread.is_alive())
        self.assertEqual(worker.groups_received, 7)
        self.assertEqual(len({s.group_id for s in list(worker.rollout_buffer.queue)}), 7)
        with self.assertRaises(RuntimeError) as cm:
            worker.check_health(60)
        self.assertIn("ran out", str(cm.exception))
        worker.stop()

    def test_trl_worker_health_reports_failure(self):
        worker = trl_adapter.AsyncRolloutWorker(self.client, "env: toolcall-match\nno_such_key: 1\n")
        worker.start()
        worker._thread.join(60)
        with self.assertRaises(RuntimeError) as cm:
            worker.check_health(60)
        self.assertIsInstance(cm.exception.__cause__, rollout.InvalidArgument)
        worker.stop()

    def test_skyrl_generator(self):
        gen = skyrl_adapter.RolloutGenerator(self.client, self.config, timeout=300)
        self.addCleanup(gen.close)
        trainer = skyrl_standin.SkyRLTrainerStandIn(gen, self.n)
        inp, out = trainer.step(live.items(2))
        self.assertEqual(out["trajectory_ids"], inp["trajectory_ids"])
        self.assertEqual(len(out["stop_reasons"]), 2 * self.n)
        self.assertTrue(set(out["stop_reasons"]) <= {"stop", "length"}, out["stop_reasons"])
        self.assertIsNotNone(out["rollout_logprobs"])
        self.assertEqual(out["rollout_metrics"]["rollout/num_groups"], 2.0)
        # Same prompt, same prompt ids within a group.
        self.assertEqual(out["prompt_token_ids"][0], out["prompt_token_ids"][self.n - 1])
        with self.assertRaises(AdapterError):
            gen.generate_sync({"prompts": [[]] * self.n, "env_extras": None, "trajectory_ids": None})

    def test_verl_manager(self):
        mgr = verl_adapter.RolloutAgentLoopManager(self.client, self.config, response_length=64, timeout=300)
        self.addCleanup(mgr.close)
        batch = verl_standin.data_proto(live.items(2), self.n, global_steps=3)
        per_sample = mgr.run(batch)
        self.assertEqual(len(per_sample), 2 * self.n)
        for o in per_sample:
            self.assertEqual(len(o["response_ids"]), len(o["response_mask"]))
            self.assertEqual(len(o["response_logprobs"]), len(o["response_ids"]))
            self.assertEqual(o["num_turns"], 1 if o["extra_fields"]["rollout_status"] == "ok" else o["num_turns"])
        out = mgr.generate_sequences(batch)
        b, nt = verl_standin.check_postprocessed(out, 2 * self.n, response_length=64)
        self.assertEqual(list(nt["rollout_status"]), ["ok"] * (2 * self.n))
        self.assertEqual(len(set(nt["rollout_group_id"])), 2)
        bad = verl_standin.data_proto(live.items(1), self.n, 0)
        del bad.non_tensor_batch["rollout_item"]
        with self.assertRaises(AdapterError):
            mgr.run(bad)


if __name__ == "__main__":
    unittest.main()
