"""What a buyer learns about one node by re-launching the market: its composed epsilon and the attacker's error.

Run: ``.venv/bin/python -m benchmarks.bench_relaunch_privacy`` (``--directory 9 30``, ``--trials 4000``,
``--seed 0``; ``--quick`` for 500 trials).

First the accountant's figures the docs quote. Then, per directory size ``D`` and ``market-min-roster-change``
(3, the default, and 1): nodes configured by the secure profile alone, read through the node's own functions
(``pass-colluders`` ``c``, roster floor, noise, budget 4, a real release ledger). The buyer holds ``c`` colluders
that add no noise and tell it their counts, and alternates two rosters: A, everyone; B, everyone but the victim
and the ``min_roster_change - 1`` colluders that leave with it. Each honest member checks its ledger, spends at
mask, records and charges at unmask, as the node does; every client survives. After each market ``N``: the
victim's and another honest node's composed epsilon, and the rms error per class on the victim's counts, measured
over ``trials`` draws of the nodes' own noise and predicted, of the *differencing* attacker (knows the colluders'
counts: ``mean(N_s over A) - mean(N_s over B)`` less those who left) and the *informed* one (knows every other
count: the record-level guarantee's adversary).
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from flwr.app import Context, RecordDict

from flmarket_flwr.market.node.node_config import read_node_settings
from flmarket_flwr.market.wire.ledger import LedgerError, ReleaseLedger
from flmarket_flwr.pass_protocol import IdentityDirectory, SkellamNoise, generate_identity, save_identity_key
from flmarket_flwr.pass_protocol.noise import SECURE_PROFILE_DELTA, SECURE_PROFILE_EPSILON


@dataclass
class Node:
    """One node of the federation as its own configuration sees it."""

    node_id: int
    key: bytes
    noise: SkellamNoise
    ledger: ReleaseLedger


def seeded(rng: np.random.Generator) -> Callable[[], np.random.Generator]:
    """A noise source for one node: the same generator, seeded from ``rng``, at every draw (reproducible runs)."""
    generator = np.random.default_rng(int(rng.integers(2**63)))
    return lambda: generator


def federation(
    folder: Path, size: int, min_roster_change: int, rng: np.random.Generator
) -> tuple[list[Node], int, int]:
    """``size`` nodes in the secure profile (identity keys and a pinned directory under ``folder``); returns the
    nodes, their ``pass-colluders`` and their roster floor."""
    publics = {}
    for node in range(1, size + 1):
        private, publics[node] = generate_identity()
        save_identity_key(private, folder / f"node-{node}.pem")
    directory = IdentityDirectory(publics)
    (folder / "directory.json").write_text(directory.to_json())
    os.environ["FLMARKET_HOME"] = str(folder / "home")
    nodes, colluders, floor = [], 0, 0
    for node in range(1, size + 1):
        config: dict[str, bool | float | int | str] = {
            "market-security": "malicious",
            "identity-key": str(folder / f"node-{node}.pem"),
            "identity-directory": str(folder / "directory.json"),
            "identity-directory-digest": directory.digest().hex(),
            "market-min-roster-change": min_roster_change,
        }
        context = Context(run_id=1, node_id=node, node_config=config, state=RecordDict(), run_config={})
        settings = read_node_settings(context)
        noise, ledger = settings.noise, settings.release_ledger
        assert noise is not None and ledger is not None and settings.privacy_budget is not None
        nodes.append(Node(node, publics[node], replace(noise, rng=seeded(rng)), ledger))
        colluders, floor = settings.colluders, settings.min_participants
    return nodes, colluders, floor


def release(members: list[Node], honest: list[Node], run: int) -> str:
    """One market over ``members``, as each honest member's handlers charge it; ``""`` or why a member refused.

    Every member checks first (its ledger's differencing rule and budget), so that a refused market spends
    nothing anywhere; then each spends at mask, records the survivors and charges the release at unmask.
    """
    session = os.urandom(16)
    keys = [m.key for m in members]
    for node in honest:
        try:
            node.ledger.check_new_session(run, session)
            node.ledger.check(run, session, keys)
        except LedgerError as err:
            return f"node {node.node_id}: {err}"
        budget = node.ledger.privacy_budget
        spends = [spend.variance for spend in node.ledger.spends()]
        if budget is not None and budget.spent([*spends, node.noise.target_variance]) > budget.epsilon:
            return f"node {node.node_id}: its budget (epsilon {budget.epsilon:g} at delta {budget.delta:g})"
    for node in honest:
        node.ledger.spend(run, session, node.noise.target_variance)
        node.ledger.record_release(run, session, keys)
        node.ledger.charge_release(run, session, node.noise.release_variance(len(members), len(members)))
    return ""


def scenario(size: int, min_roster_change: int, trials: int, classes: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory() as folder:
        nodes, c, floor = federation(Path(folder), size, min_roster_change, rng)
        victim, colluders, others = nodes[0], nodes[1 : 1 + c], nodes[1 + c :]
        leaving = colluders[: min_roster_change - 1]
        a = nodes
        b = [n for n in nodes if n is not victim and n not in leaving]
        print(
            f"\nD = {size}, market-min-roster-change = {min_roster_change}: pass-colluders {c} (colluders here: {c}, "
            f"adding no noise), roster floor {floor}, noise withstands {victim.noise.assumed_colluders(len(a))} of "
            f"{len(a)}; A = all {len(a)}, B = {len(b)} (without the victim"
            + (f" and {len(leaving)} colluders)" if leaving else ")")
        )
        if len(b) < floor:
            print(f"  B is below the roster floor {floor}: no differencing at this setting")
            return
        print(f"{'N':>3} {'roster':>6} {'victim eps':>10} {'others eps':>10} {'diff rms':>9} {'(pred)':>7}"
              f" {'informed':>9} {'(pred)':>7}")  # fmt: skip
        noise_of: dict[str, list[np.ndarray]] = {"A": [], "B": []}
        variance_of = {"A": 0.0, "B": 0.0}
        for market in range(1, 10_000):
            name, members = ("A", a) if market % 2 else ("B", b)
            honest = [n for n in members if n not in colluders]
            refused = release(members, honest, run=market)
            if refused:
                print(f"  market {market} ({name}) refused, first by {refused}; the victim took part in "
                      f"{len(noise_of['A'])} releases")  # fmt: skip
                return
            total = np.sum([n.noise.sample(trials * classes, len(members)) for n in honest], axis=0)
            noise_of[name].append(total.reshape(trials, classes).astype(float))
            variance_of[name] = len(honest) * honest[0].noise.client_variance(len(members))
            n_a, n_b = len(noise_of["A"]), len(noise_of["B"])
            informed = np.mean(noise_of["A"], axis=0)
            informed_pred = math.sqrt(variance_of["A"] / n_a)
            diff, diff_pred = "n/a", "n/a"
            if n_b:
                error = informed - np.mean(noise_of["B"], axis=0)
                diff = f"{math.sqrt(np.mean(error**2)):.2f}"
                diff_pred = f"{math.sqrt(variance_of['A'] / n_a + variance_of['B'] / n_b):.2f}"
            spent = victim.ledger.epsilon_spent(), others[0].ledger.epsilon_spent()
            print(
                f"{market:>3} {name:>6} {spent[0]:>10.3f} {spent[1]:>10.3f}"
                f" {diff:>9} {diff_pred:>7} {math.sqrt(np.mean(informed**2)):>9.2f} {informed_pred:>7.2f}",
                flush=True,
            )


def accounting() -> None:
    """The figures the docs quote from the accountant: composition, and the noise's spread in ``N_s``."""
    noise = SkellamNoise(SECURE_PROFILE_EPSILON, SECURE_PROFILE_DELTA)
    target = noise.target_variance
    print(f"target variance {target:.2f} (sd {math.sqrt(target):.2f}) per class; composed epsilon after k releases:")
    print("  " + ", ".join(f"{k}: {noise.epsilon_after(k):.3f}" for k in (1, 2, 3, 10, 12, 13)))

    def everyone(n: int) -> float:  # the noise of a sum over n clients, all honest (half the roster assumed)
        return n * noise.client_variance(n)

    spreads = [math.sqrt(everyone(n)) for n in range(3, 101)]
    print(f"  sd of N_s's noise, everyone honest, rosters 3-100: {min(spreads):.2f}-{max(spreads):.2f}")
    three = [math.sqrt(everyone(x) + everyone(y) + everyone(x + y + 1)) for x in range(3, 51) for y in range(3, 51)]
    print(
        f"  three runs over X, Y and {{v}} + X + Y (|X|, |Y| 3-50): sd of the difference {min(three):.2f}-"
        f"{max(three):.2f}; at |X| = |Y| = 3: {math.sqrt(everyone(3) * 2 + everyone(7)):.2f}"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--directory", nargs="+", type=int, default=[9, 30], help="pinned directory sizes")
    parser.add_argument("--trials", type=int, default=4000)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="500 trials")
    args = parser.parse_args(argv)
    trials = 500 if args.quick else args.trials
    print(f"secure profile: epsilon 1 per release, delta 1e-6, lifetime epsilon 4; {trials} trials x {args.classes}"
          f" classes; seed {args.seed}")  # fmt: skip
    accounting()
    for size in args.directory:
        for min_roster_change in (3, 1):
            scenario(size, min_roster_change, trials, args.classes, args.seed)


if __name__ == "__main__":
    main()
