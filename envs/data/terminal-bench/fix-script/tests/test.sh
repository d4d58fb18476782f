#!/bin/bash
# Writes 1 or 0 to /logs/verifier/reward.txt.
mkdir -p /logs/verifier
if [ "$(bash /app/sum.sh 2 3)" = "5" ] && [ "$(bash /app/sum.sh 10 -4)" = "6" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; exit 1; fi
