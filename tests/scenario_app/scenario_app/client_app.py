"""The product's ClientApp behind a mod that can hold one train round until the test opens a gate.

A SuperNode started with ``FLMARKET_TEST_GATE=<folder>`` and ``FLMARKET_TEST_GATE_ROUND=<r>`` in its environment
(the ClientApp processes it spawns inherit both) writes ``<folder>/held-<node id>`` when its train message of round
``r`` arrives, then waits until ``<folder>/open`` exists (at most ``HOLD_S``) before training: the test changes the
federation (starts new SuperNodes) while the round is held, so the next round's re-launch sees the change. Every
other message goes to the product's ClientApp as it is.
"""

import os
import time
from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from flmarket_flwr.app.client_app import app as product_app
from flmarket_flwr.market.wire.messages import ACTIONS

GATE_ENV = "FLMARKET_TEST_GATE"
GATE_ROUND_ENV = "FLMARKET_TEST_GATE_ROUND"
HOLD_S = 300.0


def hold_train_round(msg: Message, context: Context, call_next) -> Message:
    """Hold the train message of the gated round until the gate opens (or ``HOLD_S`` passes)."""
    gate, gated_round = os.environ.get(GATE_ENV), os.environ.get(GATE_ROUND_ENV)
    if gate and gated_round and msg.metadata.message_type == "train" and _round_of(msg) == int(gated_round):
        folder = Path(gate)
        (folder / f"held-{context.node_id}").write_text(gated_round, encoding="utf-8")
        deadline = time.monotonic() + HOLD_S
        while not (folder / "open").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    return call_next(msg, context)


def _round_of(msg: Message) -> int:
    """The server round a train message is for (Flower's strategies put it in the ``config`` record)."""
    config = msg.content.config_records.get("config")
    return int(config["server-round"]) if config is not None and "server-round" in config else -1


app = ClientApp(mods=[hold_train_round])
for action in ACTIONS:
    app.query(action)(product_app)
app.train()(product_app)
app.evaluate()(product_app)
