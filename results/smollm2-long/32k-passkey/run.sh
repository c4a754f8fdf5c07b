#!/bin/bash
# SmolLM2 passkey at 32K (issue 39): methods first, then the schedules.
cd "$(dirname "$0")/../../.."  # the repository root
date -u +%FT%TZ > runs/pk32/start
taskset -c 1 .venv/bin/posenc extend --model smollm2 --threads 1 --schedules none --factor 4 --lengths 1024 \
  --max-windows 1 --passkey-lengths 32768 --passkey-depths 0.25 0.75 --passkey-schedules yarn \
  --method self-extend:group=4,window=1024 dual-chunk --out runs/pk32/methods > runs/pk32/methods.log 2>&1
taskset -c 1 .venv/bin/posenc extend --model smollm2 --threads 1 --schedules none yarn rerope --factor 4 --lengths 1024 \
  --max-windows 1 --passkey-lengths 32768 --passkey-depths 0.25 0.75 --passkey-schedules yarn rerope \
  --out runs/pk32/schedules > runs/pk32/schedules.log 2>&1
date -u +%FT%TZ > runs/pk32/end
