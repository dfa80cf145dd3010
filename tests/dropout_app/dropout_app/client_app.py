"""The product's ClientApp, behind a mod that makes one SuperNode slow in PASS's ``market_mask`` round.

A SuperNode started with ``FLMARKET_TEST_HANG_MARKER=<path>`` in its environment (the ClientApp
processes it spawns inherit it) writes its node id to ``<path>`` when its ``market_mask`` message
arrives, then sleeps instead of answering: the test sees the file and kills that SuperNode's
process tree while the market is inside PASS. With ``FLMARKET_TEST_BIG_REPLY_MARKER=<path>``
instead, the node answers ``market_mask`` with its reply padded by a large random array (so that
its upload takes seconds) and writes the marker: the test kills it while the reply is on its way,
after the SuperLink registered it but before its objects arrived. ``FLMARKET_TEST_MASK_DELAY_S=<s>``
delays a node's ``market_mask`` handling by ``s`` seconds (so the cut-off reply reaches the SuperLink
before the others). Otherwise every node runs the product's ClientApp as is.
"""

import os
import time
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, Context, Message
from flwr.clientapp import ClientApp

from flmarket_flwr.app.client_app import evaluate_local, label_counts, simulated_cost_bid, train
from flmarket_flwr.market import register_market_handlers

HANG_MARKER_ENV = "FLMARKET_TEST_HANG_MARKER"
BIG_REPLY_MARKER_ENV = "FLMARKET_TEST_BIG_REPLY_MARKER"
MASK_DELAY_ENV = "FLMARKET_TEST_MASK_DELAY_S"
HANG_S = 600.0
PADDING_BYTES = 300 * 2**20


def hang_in_mask(msg: Message, context: Context, call_next) -> Message:
    """Delay ``query.market_mask`` if asked; hang there (after writing the marker) on the node to kill."""
    if msg.metadata.message_type == "query.market_mask":
        time.sleep(float(os.environ.get(MASK_DELAY_ENV, "0")))
    marker = os.environ.get(HANG_MARKER_ENV)
    if marker and msg.metadata.message_type == "query.market_mask":
        Path(marker).write_text(str(context.node_id), encoding="utf-8")
        time.sleep(HANG_S)
    return call_next(msg, context)


def pad_mask_reply(msg: Message, context: Context, call_next) -> Message:
    """Pad the ``market_mask`` reply with random bytes (and write the marker) on the node to kill."""
    reply = call_next(msg, context)
    marker = os.environ.get(BIG_REPLY_MARKER_ENV)
    if marker and msg.metadata.message_type == "query.market_mask" and not reply.has_error():
        padding = np.frombuffer(os.urandom(PADDING_BYTES), dtype=np.uint8)
        reply.content["padding"] = ArrayRecord([padding])
        Path(marker).write_text(str(context.node_id), encoding="utf-8")
    return reply


app = ClientApp(mods=[hang_in_mask, pad_mask_reply])
register_market_handlers(app, label_counts, simulated_cost_bid)  # settings from the node config
app.train()(train)
app.evaluate()(evaluate_local)
