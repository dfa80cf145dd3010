#!/usr/bin/env bash
# The digits_xl comparison with 100 clients (results/digits_xl/): the protocol of digits_xl_sweep.sh (20 local
# SGD steps, batch 32, lr 0.05, momentum 0.9, clipping at 5, plateau stop from round 30, at most 100 rounds),
# 25/50/75 of 100 selected, seeds 0-4. Resumable: finished jobs are skipped, a stopped sweep loses at most the
# jobs in flight. Run from the repository root; logs go to results/digits_xl/raw/c100.log.
#   bash simulations/digits_xl_c100_sweep.sh [workers] [raw folder]
# One job of 50 of 100 costs about 80 s on one core (20 clients: 17 s for 10 of 20); the whole grid measured
# 10.6 CPU hours, 5 h 21 min on 2 workers (results/digits_xl/README.md). The phases complete whole
# (setting, 5 seeds) cells in order of value, so a partial sweep still answers per setting:
#   1. 25 of 100, d1-d6;  2. 50 of 100, d4-d6;  3. 75 of 100, d4-d6;  4. 50 of 100, d1-d3;  5. 75 of 100, d1-d3.
set -euo pipefail
workers="${1:-2}"
raw="${2:-results/digits_xl/raw}"
mkdir -p "$raw"
protocol=(--num-clients 100 --rounds 100 --min-rounds 30 --local-steps 20 --batch-size 32 --learning-rate 0.05
          --momentum 0.9 --clip-norm 5.0 --selector flmarket rs qbs dice dds --seed 0 1 2 3 4 --workers "$workers")
engine() { python -m simulations.engine --out "$raw/c100" "${protocol[@]}" "$@" 2>&1 | tee -a "$raw/c100.log"; }

engine --num-selected 25 --distribution d1 d2 d3 d4 d5 d6
engine --num-selected 50 --distribution d4 d5 d6
engine --num-selected 75 --distribution d4 d5 d6
engine --num-selected 50 --distribution d1 d2 d3
engine --num-selected 75 --distribution d1 d2 d3
