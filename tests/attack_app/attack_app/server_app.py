"""A buyer that runs PASS and the bid step honestly through :class:`MarketPhase`, then plays the audit oracle.

Instead of the audited auction it sends every bidder ``market_audit`` with payment = bid three ways: (a) with no
award (the old oracle); (b) under the auction's award signed with a key other than the one announced before PASS
(offered for endorsement first); (c) under an award it signed naming every bidder a winner paid its bid, with no
endorsements. It writes what each node replied to the JSON file named by the run config's ``attack-out``, then
closes the market with no award. The run ends without error once the attack has run.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from logging import INFO
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import Context, Message
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from flmarket_flwr.market import MarketConfig, MarketError, MarketPhase
from flmarket_flwr.market.buyer.pass_rounds import PassResult
from flmarket_flwr.market.wire.award import Bidder, SignedAward, build_award, pack_endorsements, sign_award
from flmarket_flwr.market.wire.messages import (
    ACTION_AUDIT,
    ACTION_ENDORSE,
    KEY_AWARD,
    KEY_AWARD_SIGNATURE,
    KEY_BID_PROOF,
    KEY_ENDORSEMENTS,
    KEY_PAYMENT,
    KEY_SESSION,
    RECORD_KEY,
)
from flmarket_flwr.market.wire.records import config_record
from flmarket_flwr.pass_protocol import IdentityDirectory

NUM_CLASSES = 10  # digits
ATTACK_DONE = "the deviating buyer's attack is done"


class AttackDone(MarketError):
    """Raised once the attack has run, so that the market closes with no award."""


def reply_view(reply: Message | None) -> dict[str, Any]:
    """What a node sent back: its error reason, or the keys of its market record."""
    if reply is None:
        return {"error": "no reply", "keys": []}
    if reply.has_error():
        return {"error": reply.error.reason, "keys": []}
    return {"error": None, "keys": sorted(reply.content.config_records[RECORD_KEY])}


class AuditOracle(MarketPhase):
    """The real market up to the bids; then the audit oracle, its replies written to ``out``."""

    def __init__(self, config: MarketConfig, out: Path) -> None:
        super().__init__(config)
        self.out = out

    def _send(self, grid: Grid, action: str, fields: Mapping[int, Mapping[str, Any]]) -> dict[str, Any]:
        replies = self.exchange(grid, action, {node: config_record(dict(f)) for node, f in fields.items()})
        return {str(node): reply_view(replies.get(node)) for node in fields}

    def _audited_auction(self, grid: Grid, pass_result: PassResult, bids: Mapping[int, tuple[float, float]]) -> Any:
        session = pass_result.session
        survivors = sorted((index, node) for node, index in pass_result.indices.items())
        honest, tree = build_award(int(grid.run.run_id), session, pass_result.transcript, self.terms, survivors, bids)
        other_key = Ed25519PrivateKey.generate()
        forged = SignedAward(honest.encode(), other_key.sign(honest.encode()))
        everyone = dataclasses.replace(
            honest,
            winners=tuple(sorted(bids)),
            head=tuple(Bidder(node, score, bid, bid) for node, (score, bid) in sorted(bids.items())),
        )
        signed_everyone = sign_award(everyone, self._buyer_key)

        def under(signed: SignedAward, endorsements: bool) -> dict[int, dict[str, Any]]:
            fields: dict[str, Any] = {
                KEY_SESSION: session,
                KEY_AWARD: signed.encoded,
                KEY_AWARD_SIGNATURE: signed.signature,
            }
            if endorsements:
                fields[KEY_ENDORSEMENTS] = pack_endorsements({})
                return {node: fields for node in bids}
            # an endorse request is whole: each node's true path in the bids tree, so only the signature can fail
            return {node: {**fields, KEY_BID_PROOF: tree.proof(node)} for node in bids}

        received = {
            "bidders": sorted(bids),
            "no_award": self._send(
                grid, ACTION_AUDIT, {node: {KEY_SESSION: session, KEY_PAYMENT: bid} for node, (_, bid) in bids.items()}
            ),
            "other_key_endorse": self._send(grid, ACTION_ENDORSE, under(forged, False)),
            "other_key": self._send(grid, ACTION_AUDIT, under(forged, True)),
            "everyone_wins": self._send(grid, ACTION_AUDIT, under(signed_everyone, True)),
        }
        self.out.write_text(json.dumps(received, indent=1), encoding="utf-8")
        raise AttackDone(ATTACK_DONE)


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the attack over the connected SuperNodes; the market then closes with no award."""
    config = context.run_config
    directory = str(config["identity-directory"])
    market = MarketConfig(
        budget=float(config["budget"]),
        num_classes=NUM_CLASSES,
        security=str(config["market-security"]),
        directory=IdentityDirectory.from_json(Path(directory)) if directory else None,
        timeout=float(config["market-timeout"]),
        wait_for_nodes_timeout=float(config["wait-for-nodes-timeout"]),
        expected_nodes=int(config["expected-nodes"]),
        session_label=f"flmarket-run-{context.run_id}",
    )
    try:
        AuditOracle(market, Path(str(config["attack-out"]))).run(grid)
    except AttackDone:
        log(INFO, "Attack: %s", ATTACK_DONE)
