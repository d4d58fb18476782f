#!/bin/bash
# Writes 1 or 0 to /logs/verifier/reward.txt.
mkdir -p /logs/verifier
if [ "$(git -C /app/repo log -1 --format=%s 2>/dev/null)" = "initial commit" ] && [ "$(git -C /app/repo show HEAD:README 2>/dev/null)" = "rollout" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; exit 1; fi
