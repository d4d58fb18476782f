"""The client against a real `rollout serve` and the real llama.cpp engine
(live.py says how they are given)."""

import os
import unittest
import uuid

import rollout
from rollout import to_batch

import live


class ClientLive(live.LiveCase):

    def test_installed_package(self):
        # python_test.go runs the tests against the pip-installed package,
        # never the source tree.
        if os.environ.get("ROLLOUT_EXPECT_INSTALLED") == "1":
            self.assertIn("site-packages", rollout.__file__)

    def test_version_and_catalogue(self):
        v = self.client.version()
        self.assertTrue(v.version)
        names = [e.name for e in self.client.list_environments()]
        self.assertIn("toolcall-match", names)
        d = self.client.describe_environment("toolcall-match")
        self.assertEqual(d["environment"].name, "toolcall-match")
        self.assertIsInstance(d["config_schema"], dict)
        with self.assertRaises(rollout.NotFound):
            self.client.describe_environment("no-such-env")

    def test_errors_name_the_field(self):
        with self.assertRaises(rollout.InvalidArgument) as cm:
            self.client.start_job("env: toolcall-match\nno_such_key: 1\n")
        self.assertIn("no_such_key", str(cm.exception))
        with self.assertRaises(rollout.NotFound):
            self.client.get_job("job-that-does-not-exist")
        with self.assertRaises((rollout.NotFound, rollout.FailedPrecondition)):
            self.client.end_policy_update("no-such-stream", 1)
        with self.assertRaises(ValueError):
            self.client.begin_policy_update("x", 1, mode="sometimes")

    def test_collect_items_with_credits(self):
        its = live.items(2)
        with self.client.collect(self.config, initial_credits=1) as s:
            s.items(its, request_id="r1", policy_version=7)
            groups = [s.get(timeout=300)]
            # One credit: the second item waits for the next one.
            self.assertLessEqual(s.status.in_flight + len(groups), 2)
            s.credit(1)
            groups.append(s.get(timeout=300))
        self.assertEqual(sorted(g.item_id for g in groups), sorted("r1/" + it["id"] for it in its))
        for g in groups:
            self.assertEqual(g.request_id, "r1")
            self.assertEqual(g.policy_version, 7)
            self.assertEqual(len(g.rollouts), self.group_size)
            for r in g.rollouts:
                self.assertEqual(r.status, "ok", r.failure_message)
                self.assertEqual(len(r.loss_mask), len(r.tokens))
                self.assertGreater(r.prompt_tokens, 0)
                self.assertGreater(sum(r.response_mask), 0)
                self.assertEqual(sum(r.loss_mask[:r.prompt_tokens]), 0)
                self.assertIsNotNone(r.logprobs)  # llama.cpp scores every sampled id
                self.assertTrue(all(lp <= 0.0 for lp, m in zip(r.logprobs, r.loss_mask) if m))
        b = to_batch(groups)
        self.assertEqual(len(b), 2 * self.group_size)
        p = b.padded()
        self.assertEqual(len(p["prompt_ids"]), len(b))

    def test_job_layouts_agree(self):
        # One job, its groups read back in both token layouts: the decoded
        # columns must be the same.
        cfg = self.config + "groups: 1\noutput:\n  dir: runs/py-layouts-%s\n" % uuid.uuid4().hex[:8]
        job = self.client.start_job(cfg)
        final = None
        for kind, val in self.client.watch_job(job.id, include_groups=False, timeout=300):
            if kind == "finished":
                final = val
        self.assertIsNotNone(final)
        self.assertEqual(final.state, rollout.v1.rollout_pb2.JOB_STATE_SUCCEEDED, final.error)

        def read(compact):
            return [v for k, v in self.client.watch_job(job.id, from_sequence=0, compact=compact, timeout=60)
                    if k == "group"]

        full, comp = read(False), read(True)
        self.assertEqual(len(full), 1)
        self.assertEqual(len(comp), 1)
        self.assertGreater(full[0].raw.ByteSize(), comp[0].raw.ByteSize())
        for a, b in zip(full[0].rollouts, comp[0].rollouts):
            self.assertEqual((a.tokens, a.loss_mask, a.logprobs), (b.tokens, b.loss_mask, b.logprobs))

    def test_policy_update_stamps_versions(self):
        stream_id = "py-update-" + uuid.uuid4().hex[:8]
        its = live.items(2)
        with self.client.collect(self.config, initial_credits=0, stream_id=stream_id) as s:
            s.items(its[:1], request_id="before")
            s.credit(1)
            before = s.get(timeout=300)
            with self.client.policy_update(stream_id, 1, mode="wait") as begin:
                self.assertGreaterEqual(begin.in_flight, 0)
                with self.assertRaises(rollout.FailedPrecondition):
                    self.client.begin_policy_update(stream_id, 2)
            s.credit(0, trainer_version=1)
            s.items(its[1:], request_id="after")
            s.credit(1)
            after = s.get(timeout=300)
        self.assertEqual(before.max_policy_version, 0)
        self.assertEqual(after.min_policy_version, 1)
        for r in after.rollouts:
            self.assertTrue(all(v == 1 for v, m in zip(r.token_versions, r.loss_mask) if m))


if __name__ == "__main__":
    unittest.main()
