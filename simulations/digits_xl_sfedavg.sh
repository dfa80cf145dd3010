#!/usr/bin/env bash
# FLMarket against S-FedAvg, the in-training baseline, on digits_xl (results/digits_xl/): accuracy and run time.
# Both sides take the same 10-per-class validation split out of the training pool (S-FedAvg values updates on it),
# so they train on the same client data; FLMarket runs its real market phase (PASS, the clients' own scores and
# bids, the auction; engine option --market protocol), timed, then FedAvg on its 5 winners; S-FedAvg samples 5 of
# the 20 clients every round and values them (10 Monte-Carlo permutations on the validation split).
# Resumable like the other sweeps. Run from the repository root; logs go to results/digits_xl/raw/*.log.
#   bash simulations/digits_xl_sfedavg.sh [workers] [raw folder]
#   1. the digits CNN, the sweeps' protocol: 5 of 20, d1-d6, seeds 0-4 (60 jobs, about 12 CPU minutes);
#   2. ResNet-56 (853k parameters) on the images upsampled to 3x32x32 (dataset digits_xl_rgb32): 5 of 20, d4,
#      seed 0, 30 rounds without plateau stopping (one local step costs 0.32 s on one core: about 20 CPU minutes
#      a run). On a GPU machine, add seeds and distributions and pass --device cuda.
set -euo pipefail
workers="${1:-1}"
raw="${2:-results/digits_xl/raw}"
mkdir -p "$raw"
common=(--num-clients 20 --num-selected 5 --selector flmarket sfedavg --val-per-class 10 --market protocol
        --local-steps 20 --batch-size 32 --learning-rate 0.05 --momentum 0.9 --clip-norm 5.0 --workers "$workers")

python -m simulations.engine --out "$raw/sfedavg" "${common[@]}" --rounds 100 --min-rounds 30 \
    --distribution d1 d2 d3 d4 d5 d6 --seed 0 1 2 3 4 2>&1 | tee -a "$raw/sfedavg.log"
python -m simulations.engine --out "$raw/resnet56" "${common[@]}" --rounds 30 --min-rounds 0 \
    --dataset digits_xl_rgb32 --model resnet56 --distribution d4 --seed 0 2>&1 | tee -a "$raw/resnet56.log"
