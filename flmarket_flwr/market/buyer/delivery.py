"""Who delivered what after the auction: the winners' training record, and payment on delivery.

The auction awards each winner a payment at selection. :class:`DeliveryLedger` then records, for every
train message a winner was sent, whether an update came back (a reply with content, not an error) and
why not; :meth:`DeliveryLedger.settle` turns the awards into what is owed: in full (pay at selection,
the default), or on delivery, pro rata to the rounds delivered out of the rounds a winner was asked to
train (a winner that never returns an update is paid nothing; one never asked, e.g. with
``fraction_train < 1``, is paid in full: it was not asked for anything).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from flwr.app import Message, MessageType

__all__ = ["DeliveryLedger", "DeliveryRecord"]


@dataclass
class DeliveryRecord:
    """One winner's training record.

    Attributes
    ----------
    asked : int
        Train messages the winner was sent.
    delivered : int
        Updates it returned (replies with content, not errors).
    failures : list[str]
        ``"round <r>: <reason>"`` for each train message without an update (``r`` in the run's numbering).
    """

    asked: int = 0
    delivered: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def share_delivered(self) -> float:
        """Updates returned per train message sent; 1.0 when never asked."""
        return self.delivered / self.asked if self.asked else 1.0


class DeliveryLedger:
    """The winners' training record, fed with every train round's messages and replies.

    Parameters
    ----------
    winners : Sequence[int]
        Node ids of the auction's winners.
    """

    def __init__(self, winners: Sequence[int]) -> None:
        self.records: dict[int, DeliveryRecord] = {int(node): DeliveryRecord() for node in winners}
        self.rounds = 0

    def record(self, messages: Iterable[Message], replies: Iterable[Message], server_round: int | None = None) -> None:
        """Record one exchange: every train message in ``messages`` and the replies that came back.

        An exchange with train messages is one training round: ``server_round``, the run's number of it, names it
        in the failures (``None``: this ledger's own count, from 1). Messages of other types (evaluate,
        queries) are ignored; a reply is matched to its message by ``reply_to_message_id``, never by
        its sender (an error reply made by the transport names another one).
        """
        sent = {
            message.metadata.message_id: message.metadata.dst_node_id
            for message in messages
            if message.metadata.message_type == MessageType.TRAIN
        }
        if not sent:
            return
        self.rounds += 1
        server_round = self.rounds if server_round is None else int(server_round)
        answered = {reply.metadata.reply_to_message_id: reply for reply in replies}
        for message_id, node in sent.items():
            record = self.records.setdefault(int(node), DeliveryRecord())
            record.asked += 1
            reply = answered.get(message_id)
            if reply is None:
                record.failures.append(f"round {server_round}: no reply within the round's timeout")
            elif reply.has_error():
                record.failures.append(f"round {server_round}: error reply ({reply.error.reason})")
            else:
                record.delivered += 1

    def settle(self, payments: Mapping[int, float], *, on_delivery: bool) -> dict[int, float]:
        """What each awarded node is owed: its award, or with ``on_delivery`` the delivered share of it."""
        if not on_delivery:
            return {int(node): float(payment) for node, payment in payments.items()}
        return {
            int(node): float(payment) * self.records.get(int(node), DeliveryRecord()).share_delivered
            for node, payment in payments.items()
        }

    def to_dict(self, payments: Mapping[int, float], *, on_delivery: bool) -> dict[str, Any]:
        """Plain-Python form for ``market.json``: per winner its record, award and settled payment."""
        settled = self.settle(payments, on_delivery=on_delivery)
        return {
            "settle_on_delivery": on_delivery,
            "total_settled": sum(settled[node] for node in self.records if node in settled),
            "winners": {
                str(node): {
                    "asked": record.asked,
                    "delivered": record.delivered,
                    "failures": list(record.failures),
                    "award": float(payments.get(node, 0.0)),
                    "settled": settled.get(node, 0.0),
                }
                for node, record in self.records.items()
            },
        }
