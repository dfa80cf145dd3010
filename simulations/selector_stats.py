"""The pre-training baselines' statistics query (RS, QBS, DICE, DDS): both ends of it, for experiments only.

The baselines select on every client's **raw** label counts (and, for DDS, an embedding of its
inputs): no privacy at all, by design. The product's ClientApp never answers this query; only the
experiments' ClientApp (:func:`simulations.apps.build_client_app`), which its operator chose to run,
registers :func:`answer_selector_stats`. The server side (:func:`collect_selector_stats`) lives here too.
"""

from __future__ import annotations

from collections.abc import Sequence
from logging import WARNING

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid
from flwr.supercore import log

__all__ = ["ACTION_SELECTOR_STATS", "answer_selector_stats", "collect_selector_stats"]

ACTION_SELECTOR_STATS = "selector_stats"
"""Action of the statistics query (message type ``query.selector_stats``)."""
STATS_RECORD_KEY = "selector-stats"
KEY_WANT_EMBEDDING = "want-embedding"
KEY_EMBEDDING_DIM = "embedding-dim"
KEY_PROJECTION_SEED = "projection-seed"
KEY_LABEL_COUNTS = "label-counts"
KEY_EMBEDDING = "embedding"


def _int_field(record: ConfigRecord, key: str, default: int) -> int:
    """``record[key]`` as an int (``default`` when absent); a clear error when it is not an integer."""
    value = record.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{key!r} must be an int, got {type(value).__name__}")
    return value


def answer_selector_stats(msg: Message, context: Context, val_per_class: int = 0) -> Message:
    """Client side: reply with this client's label counts in clear (and, if asked, its embedding).

    Not private: the server sees every client's counts. Register it only in an experiments ClientApp.
    ``val_per_class``: the validation split held out of the training pool (the app's data config's).
    """
    # pylint: disable-next=import-outside-toplevel
    from flmarket_flwr.app.client_app import data_config_of, label_counts, partition_id_of
    from flmarket_flwr.app.task import EMBEDDING_DIM, data_embedding  # pylint: disable=import-outside-toplevel

    request = msg.content.config_records.get(STATS_RECORD_KEY, ConfigRecord())
    reply = ConfigRecord({KEY_LABEL_COUNTS: [int(c) for c in label_counts(context, val_per_class)]})
    if bool(request.get(KEY_WANT_EMBEDDING, False)):
        embedding = data_embedding(
            partition_id_of(context),
            data_config_of(context, val_per_class),
            dim=_int_field(request, KEY_EMBEDDING_DIM, EMBEDDING_DIM),
            seed=_int_field(request, KEY_PROJECTION_SEED, 0),
        )
        reply[KEY_EMBEDDING] = [float(v) for v in embedding]
    return Message(content=RecordDict({STATS_RECORD_KEY: reply}), reply_to=msg)


# pylint: disable=too-many-arguments,too-many-locals
def collect_selector_stats(
    grid: Grid,
    nodes: Sequence[int],
    *,
    num_classes: int,
    embedding_dim: int | None,
    projection_seed: int,
    timeout: float,
) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray], dict[int, str]]:
    """Server side: one ``query.selector_stats`` round; ``(counts, embeddings, excluded)`` by node id.

    Parameters
    ----------
    grid : Grid
        The ServerApp's grid.
    nodes : Sequence[int]
        Nodes to ask.
    num_classes : int
        Length of every label-count vector.
    embedding_dim : int or None
        Ask for an input embedding of this size (DDS); ``None``: counts only.
    projection_seed : int
        Seed of the embedding's random projection (the same for every client).
    timeout : float
        Seconds to wait for the replies.

    Returns
    -------
    tuple
        Label counts and embeddings of the nodes that answered, and the excluded nodes with a reason
        (no reply, an error reply, or a malformed one).
    """
    request = ConfigRecord(
        {
            KEY_WANT_EMBEDDING: embedding_dim is not None,
            KEY_EMBEDDING_DIM: int(embedding_dim or 0),
            KEY_PROJECTION_SEED: int(projection_seed),
        }
    )
    messages = [
        Message(
            RecordDict({STATS_RECORD_KEY: request}),
            dst_node_id=int(node),
            message_type=f"query.{ACTION_SELECTOR_STATS}",
            group_id="selector-stats",
        )
        for node in nodes
    ]
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    node_of = {message.metadata.message_id: message.metadata.dst_node_id for message in messages}
    counts: dict[int, np.ndarray] = {}
    embeddings: dict[int, np.ndarray] = {}
    excluded: dict[int, str] = {}
    for reply in replies:
        node = node_of.get(reply.metadata.reply_to_message_id)
        if node is None or node in counts or node in excluded:
            continue
        try:
            counts[node], embedding = _read_stats(reply, num_classes, embedding_dim)
        except ValueError as err:
            excluded[node] = str(err)
            continue
        if embedding is not None:
            embeddings[node] = embedding
    for node in nodes:
        if node not in counts and node not in excluded:
            excluded[node] = f"no reply within {timeout:g} s"
    for node, reason in sorted(excluded.items()):
        log(WARNING, "Selection: excluding node %d (%s)", node, reason)
    return counts, embeddings, excluded


def _read_stats(reply: Message, num_classes: int, embedding_dim: int | None) -> tuple[np.ndarray, np.ndarray | None]:
    """Validate one reply: ``(label counts, embedding or None)``."""
    if reply.has_error():
        raise ValueError(f"error reply: {reply.error.reason}")
    record = reply.content.config_records.get(STATS_RECORD_KEY)
    if record is None or KEY_LABEL_COUNTS not in record:
        raise ValueError("reply carries no label counts")
    values = list(record[KEY_LABEL_COUNTS])  # type: ignore[arg-type]
    if len(values) != num_classes or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ValueError(f"label counts must be {num_classes} non-negative ints")
    embedding = None
    if embedding_dim is not None:
        raw = record.get(KEY_EMBEDDING)
        embedding = np.asarray(list(raw) if raw is not None else [], dtype=np.float64)  # type: ignore[arg-type]
        if embedding.shape != (embedding_dim,) or not np.all(np.isfinite(embedding)):
            raise ValueError(f"embedding must be {embedding_dim} finite floats")
    return np.asarray(values, dtype=np.int64), embedding
