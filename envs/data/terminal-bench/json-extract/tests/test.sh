#!/bin/bash
# Writes 1 or 0 to /logs/verifier/reward.txt.
mkdir -p /logs/verifier
if [ "$(tr -d "[:space:]" < /app/oldest.txt 2>/dev/null)" = "grace" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; exit 1; fi
