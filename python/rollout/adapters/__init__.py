"""Trainer adapters, each a thin layer over :class:`rollout.Client`:

- :mod:`rollout.adapters.trl`: ``rollout_func`` for TRL's GRPOTrainer, a
  rollout worker and a weight-transfer wrapper for its AsyncGRPOTrainer;
- :mod:`rollout.adapters.skyrl`: a SkyRL ``GeneratorInterface``;
- :mod:`rollout.adapters.verl`: a replacement for verl's agent-loop manager.

None imports its trainer: they follow the trainers' published interfaces
(docs/trainers/*.md names the versions read) and return plain lists and
dicts that those trainers accept.
"""
