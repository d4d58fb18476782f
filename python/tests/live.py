"""Settings of the live tests: a real `rollout serve` (ROLLOUT_ADDR) and the
run config its streams use (ROLLOUT_CONFIG, a YAML file: env toolcall-match
with the real llama.cpp engine; group_size given by ROLLOUT_GROUP_SIZE).
python/python_test.go sets them. Without them the live tests skip, except
with CI=true, where they fail."""

import json
import os
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ITEMS = os.path.join(HERE, "..", "..", "envs", "data", "toolcall_match.jsonl")


def settings():
    addr, cfg = os.environ.get("ROLLOUT_ADDR"), os.environ.get("ROLLOUT_CONFIG")
    if not addr or not cfg:
        msg = "ROLLOUT_ADDR and ROLLOUT_CONFIG are not set (python/python_test.go sets them)"
        if os.environ.get("CI") == "true":
            raise AssertionError("CI=true: " + msg)
        raise unittest.SkipTest(msg)
    with open(cfg) as f:
        config = f.read()
    return addr, config, int(os.environ.get("ROLLOUT_GROUP_SIZE", "2"))


def items(n, split="train"):
    """n toolcall-match items (the env's own data) as dicts, without their
    ids and split (the adapters give ids)."""
    path = os.environ.get("ROLLOUT_ITEMS", ITEMS)
    out = []
    with open(path) as f:
        for line in f:
            it = json.loads(line)
            if it.get("split", "train") != split:
                continue
            it.pop("split", None)
            out.append(it)
            if len(out) == n:
                break
    if len(out) < n:
        raise AssertionError("%s: %d %s items, want %d" % (path, len(out), split, n))
    return out


class LiveCase(unittest.TestCase):
    """A test case with a connected rollout.Client (cls.client), the run
    config (cls.config) and its group size (cls.group_size)."""

    @classmethod
    def setUpClass(cls):
        from rollout import Client

        cls.addr, cls.config, cls.group_size = settings()
        cls.client = Client(cls.addr, timeout=60)
        cls.client.wait_ready(60)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
