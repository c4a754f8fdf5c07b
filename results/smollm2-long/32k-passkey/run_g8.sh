#!/bin/bash
# After run.sh: Self-Extend G8 (covers 32K: (8192 - 1024) x 8 + 1024 = 58,368 positions) at the same two depths.
cd "$(dirname "$0")/../../.."  # the repository root
while [ ! -f runs/pk32/end ]; do sleep 20; done
taskset -c 1 .venv/bin/posenc extend --model smollm2 --threads 1 --schedules none --factor 4 --lengths 1024 \
  --max-windows 1 --passkey-lengths 32768 --passkey-depths 0.25 0.75 --passkey-schedules yarn \
  --method self-extend:group=8,window=1024 --out runs/pk32/g8 > runs/pk32/g8.log 2>&1
date -u +%FT%TZ > runs/pk32/g8.end
