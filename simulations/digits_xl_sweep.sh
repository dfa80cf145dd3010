#!/usr/bin/env bash
# The digits_xl comparison (results/digits_xl/): resumable, finished jobs are skipped, a stopped sweep
# loses at most the jobs in flight. Run from the repository root; logs go to results/digits_xl/raw/*.log.
#   bash simulations/digits_xl_sweep.sh [workers]
# Phases in order of value, so a partial sweep still answers the most:
#   1. primary: 20 clients, d1-d6, 5/10/15 selected, seeds 0-4, the five pre-training selectors;
#   2. sensitivity at d4-d6, 10 of 20, seeds 0-4: FLMarket's bid policy, DICE's weight, DDS's lambda;
#   3. seeds 5-9 on d4-d6 (the headline gets 10 paired seeds).
set -euo pipefail
workers="${1:-2}"
raw=results/digits_xl/raw
mkdir -p "$raw"
protocol=(--rounds 100 --min-rounds 30 --local-steps 20 --batch-size 32 --learning-rate 0.05 --momentum 0.9
          --clip-norm 5.0 --workers "$workers")
selectors=(flmarket rs qbs dice dds)
engine() { python -m simulations.engine "${protocol[@]}" "$@"; }

engine --out "$raw/c20" --distribution d1 d2 d3 d4 d5 d6 --num-selected 5 10 15 \
    --selector "${selectors[@]}" --seed 0 1 2 3 4 2>&1 | tee -a "$raw/c20.log"
engine --out "$raw/bids" --distribution d4 d5 d6 --num-selected 10 --selector flmarket \
    --bid-policy constant random --seed 0 1 2 3 4 2>&1 | tee -a "$raw/bids.log"
engine --out "$raw/dice" --distribution d4 d5 d6 --num-selected 10 --selector dice \
    --dice-volume-weight 0.25 0.75 --seed 0 1 2 3 4 2>&1 | tee -a "$raw/dice.log"
engine --out "$raw/dds" --distribution d4 d5 d6 --num-selected 10 --selector dds \
    --dds-diversity-weight 0.5 2.0 --seed 0 1 2 3 4 2>&1 | tee -a "$raw/dds.log"
engine --out "$raw/c20" --distribution d4 d5 d6 --num-selected 5 10 15 \
    --selector "${selectors[@]}" --seed 5 6 7 8 9 2>&1 | tee -a "$raw/c20.log"
