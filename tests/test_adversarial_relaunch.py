"""A dishonest buyer against the market re-launch: it re-launches to reset a node's per-run protections or to get
releases its privacy budget does not pay for; each attack here is played and shown to fail."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from adversary import record_of, send
from flwr.app import RecordDict
from test_colluders import CLASSES, colluding_app, counts_of
from test_market_relaunch import market, secure_grid
from test_secure_profile_market import profile_setup

from flmarket_flwr.market import MarketError, MarketPhase
from flmarket_flwr.market.buyer import server as market_server
from flmarket_flwr.market.wire.records import context_to_bytes
from flmarket_flwr.pass_protocol import PassError
from flmarket_flwr.pass_protocol.noise import SECURE_PROFILE_DELTA, SkellamNoise, composed_epsilon
from simulations.inprocess_grid import InProcessGrid


@pytest.fixture(autouse=True)
def ledger_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "flmarket-home"
    monkeypatch.setenv("FLMARKET_HOME", str(home))
    return home


def spent_variances(ledger_home: Path) -> list[list[float]]:
    """Each node's recorded privacy spends (aggregate variances), one list per node's ledger."""
    paths = sorted(ledger_home.glob("ledger/*/release-ledger.json"))
    return [[spend["variance"] for spend in json.loads(path.read_text())["spent"]] for path in paths]


def reuse_session_ids(monkeypatch: pytest.MonkeyPatch, tokens: list[bytes]) -> None:
    """The buyer picks each market's PASS session id itself: ``tokens`` in order (its random part)."""
    queue = list(tokens)
    monkeypatch.setattr(market_server, "secrets", SimpleNamespace(token_bytes=lambda n: queue.pop(0)))


def test_the_ledger_refuses_a_new_session_under_a_run_and_session_it_spent_or_released(tmp_path: Path) -> None:
    """:meth:`ReleaseLedger.check_new_session`: a session id this node spent (at mask) or released (at unmask) in
    a run is refused when joined again; another run or another session passes."""
    from flmarket_flwr.market.wire.ledger import LedgerError, ReleaseLedger

    ledger = ReleaseLedger(tmp_path / "ledger")
    ledger.check_new_session(1, b"A")
    ledger.spend(1, b"A", 4.0)
    with pytest.raises(LedgerError, match="already spent or released"):
        ledger.check_new_session(1, b"A")
    ledger.record_release(1, b"B", [b"node:1", b"node:2", b"node:3"])
    with pytest.raises(LedgerError, match="already spent or released"):
        ledger.check_new_session(1, b"B")
    ledger.check_new_session(2, b"A")
    ledger.check_new_session(1, b"C")


def restart_nodes(grid: InProcessGrid) -> None:
    """Every SuperNode restarts: its ``context.state`` (the run's market state) is lost, its ledger file is not."""
    for node in grid.node_ids:
        context = grid.context(node)
        context.state = RecordDict()
        grid._contexts[node] = context_to_bytes(context)


# --- Re-launching under an earlier market's session id --------------------------------------------------
def test_a_relaunch_under_an_earlier_markets_session_id_is_refused_and_every_release_is_charged(
    tmp_path: Path, ledger_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The buyer runs markets under session ids A, B, then A again. A node's ledger recorded A's spend and
    members; a retried message of the same session is free, so without a check a third release under A would
    cost the node nothing and pass the differencing check as 'already recorded'. Repeating A and B, the buyer
    would average the fresh noise of as many releases of the same sum as it likes. Every node refuses the third
    market (its budget, 4, would pay for a third release under a new id), and each ledger holds one spend per
    release, composed to the accountant's epsilon."""
    grid, counts, directory = secure_grid(tmp_path, 6, total_epsilon=4.0)
    a, b = b"A" * 16, b"B" * 16
    reuse_session_ids(monkeypatch, [a, b, a])
    first = MarketPhase(market(directory)).run(grid)
    second = MarketPhase(market(directory)).run(grid)
    assert first.status == second.status == "succeeded"
    with pytest.raises(MarketError) as caught:
        MarketPhase(market(directory)).run(grid)
    reasons = caught.value.outcome.excluded  # type: ignore[union-attr]
    assert set(reasons) == set(counts) and all("advertise: request refused" in r for r in reasons.values())
    noise = SkellamNoise(1.0, SECURE_PROFILE_DELTA)
    for variances in spent_variances(ledger_home):
        assert len(variances) == 2  # two releases, two spends
        assert composed_epsilon(variances, SECURE_PROFILE_DELTA) == pytest.approx(noise.epsilon_after(2), rel=1e-9)


def test_a_relaunch_under_a_fresh_session_id_is_joined_and_charged(
    tmp_path: Path, ledger_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the same three markets under three distinct ids all run, and each node spends three times."""
    grid, _, directory = secure_grid(tmp_path, 6, total_epsilon=4.0)
    reuse_session_ids(monkeypatch, [b"A" * 16, b"B" * 16, b"C" * 16])
    outcomes = [MarketPhase(market(directory)).run(grid) for _ in range(3)]
    assert [outcome.status for outcome in outcomes] == ["succeeded"] * 3
    noise = SkellamNoise(1.0, SECURE_PROFILE_DELTA)
    for variances in spent_variances(ledger_home):
        assert composed_epsilon(variances, SECURE_PROFILE_DELTA) == pytest.approx(noise.epsilon_after(3), rel=1e-9)
    assert not np.array_equal(outcomes[0].global_counts, outcomes[2].global_counts)  # fresh noise each time


def test_after_a_node_restart_its_ledger_still_refuses_an_earlier_session_id(
    tmp_path: Path, ledger_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same attack after the nodes restarted (their market state in ``context.state`` is gone): the ledger
    file remembers that run and session spent, and every node refuses the session id at advertise."""
    grid, counts, directory = secure_grid(tmp_path, 6, total_epsilon=4.0)
    reuse_session_ids(monkeypatch, [b"A" * 16, b"B" * 16, b"A" * 16])
    MarketPhase(market(directory)).run(grid)
    MarketPhase(market(directory)).run(grid)
    restart_nodes(grid)
    with pytest.raises(MarketError) as caught:
        MarketPhase(market(directory)).run(grid)
    reasons = caught.value.outcome.excluded  # type: ignore[union-attr]
    assert set(reasons) == set(counts) and all("refused by the node's release ledger" in r for r in reasons.values())
    assert all(len(variances) == 2 for variances in spent_variances(ledger_home))


# --- Re-launching before the earlier market closed ------------------------------------------------------
def snapshot_after(grid: InProcessGrid, node: int, action: str) -> dict[str, bytes]:
    """Keep ``node``'s persisted context right after it answered ``query.<action>`` (the buyer stops there)."""
    kept: dict[str, bytes] = {}

    def hook(message, reply):  # type: ignore[no-untyped-def]
        if message.metadata.dst_node_id == node and message.metadata.message_type == f"query.{action}":
            kept["context"] = grid._contexts[node]
        return reply

    grid.reply_hook = hook
    return kept


@pytest.mark.parametrize("stopped_after", ["market_unmask", "market_bid", "market_endorse"])
def test_a_relaunch_before_the_earlier_market_closed_is_refused_by_the_node_left_open(
    tmp_path: Path, stopped_after: str
) -> None:
    """The buyer stops market 1 for one node after its unmask (or its bid, or its endorsement): no award, no
    abort. A re-launch is joined only once the earlier market closed, so that node refuses at advertise while
    the others, whose market closed, join (their roster floor is 1: a node leaving is what the test plays)."""
    grid, counts, directory = secure_grid(tmp_path, 7, total_epsilon=4.0, **{"market-min-roster-change": 1})
    victim = sorted(counts)[0]
    kept = snapshot_after(grid, victim, stopped_after)
    MarketPhase(market(directory)).run(grid)
    grid.reply_hook = None
    grid._contexts[victim] = kept["context"]  # the award (or abort) never reached it
    second = MarketPhase(market(directory)).run(grid)
    assert second.status == "succeeded" and victim not in second.pass_participants
    assert second.excluded[victim].startswith("market_advertise") and "request refused" in second.excluded[victim]


# --- An old award after a re-launch -------------------------------------------------------------------
def test_an_award_endorsed_in_an_earlier_market_opens_no_counts_after_a_relaunch(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A node won market 1 and endorsed its award; the re-launch cleared that state. The buyer, with the node
    at its bid in market 2 (it endorsed market 2's award), asks it to open its counts against market 1's award,
    under either session: refused, the counts stay shut."""
    from flmarket_flwr.market import read_award
    from flmarket_flwr.market.wire.messages import KEY_AWARD, KEY_ENDORSEMENTS, KEY_SESSION

    grid, counts, directory = secure_grid(tmp_path, 6, total_epsilon=4.0)
    node = sorted(counts)[0]
    first = MarketPhase(market(directory)).run(grid)
    old = read_award(grid.context(node))
    assert node in first.winners and old is not None and old.award is not None
    old_session = grid.context(node).state.config_records["flmarket"]["pass/session"]
    kept = snapshot_after(grid, node, "market_endorse")
    MarketPhase(market(directory)).run(grid)
    grid.reply_hook = None
    grid._contexts[node] = kept["context"]  # market 2, stopped after this node endorsed its award
    new_session = grid.context(node).state.config_records["flmarket"]["pass/session"]
    assert new_session != old_session
    for session in (old_session, new_session):
        request = {KEY_SESSION: session, KEY_AWARD: old.award, KEY_ENDORSEMENTS: b""}
        reply = send(grid, "market_audit", {node: request})[node]
        assert reply.has_error() and "market_audit: request refused" in reply.error.reason
    assert "the audit does not show the award this client endorsed" in caplog.text
    assert "not for the PASS session this client took part in" in caplog.text


# --- The client's cheaper checks (pass_protocol.client) ---------------------------------------------------
def test_another_edges_validly_signed_ciphertext_relayed_to_a_receiver_gets_no_channel_secret() -> None:
    """The buyer relays to receiver 1, as ``v``'s, the ciphertext (digest and signature too) that ``v`` really
    sent and signed for another receiver ``w``. It does not open at 1, so 1 checks the signature, which binds
    the receiver's index: it is not ``v``'s for this edge, and 1 accuses ``v`` without proving its channel secret
    (which would open what ``v`` sent 1)."""
    from test_pass_secagg import _counts, _signed_session

    session = _signed_session(_counts(np.random.default_rng(41), 7, 3), degree=4)
    requests = session.share(session.advertise())
    inbox = requests[1]
    sender = inbox.senders[0]
    other = next(w for w, r in requests.items() if w != 1 and sender in r.senders)
    j = requests[other].senders.index(sender)
    i = inbox.senders.index(sender)

    def swapped(values: list, replacement: object) -> list:
        return [replacement if position == i else value for position, value in enumerate(values)]

    theirs = requests[other]
    relayed = dataclasses.replace(
        inbox,
        ciphertexts=swapped(list(inbox.ciphertexts), theirs.ciphertexts[j]),
        share_digests=swapped(list(inbox.share_digests), theirs.share_digests[j]),
        signatures=swapped(list(inbox.signatures), theirs.signatures[j]),
    )
    with contextlib.suppress(PassError):
        session.mask({**requests, 1: relayed})
    assert session.masked[1].accused == [sender] and session.masked[1].proofs == [b""]


def test_unmask_is_refused_when_fewer_than_t_neighbours_signed_the_set_even_with_real_signatures_beside(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The buyer shows ``k - t + 1`` of the victim's neighbours another set (a third node dropped): they sign it
    with their real keys. The victim is sent its own set with all ``k`` signers: ``t - 1`` valid on its set and
    the others real signatures on the other set. The check stops after ``t`` valid ones and skips invalid ones;
    here it never reaches ``t``, and the victim sends no share."""
    from test_adversarial_views import _signed_to_consistency

    from flmarket_flwr.pass_protocol.graph import share_threshold
    from flmarket_flwr.pass_protocol.messages import ConsistencyRequest, UnmaskRequest

    grid, server, requests = _signed_to_consistency(size=10)
    victim = server.survivors[0]
    neighbours = sorted(server.graph[victim])
    t = share_threshold(len(neighbours))
    dropped = neighbours[-1]  # shown dropped to the split-off neighbours, a survivor to everyone else
    split = neighbours[: len(neighbours) - t + 1]
    assert dropped not in split
    other = UnmaskRequest.of([u for u in server.survivors if u != dropped], [dropped])
    signatures: dict[int, bytes] = {}
    for index in server.survivors:
        request = ConsistencyRequest(other.survivors, other.dropped) if index in split else requests[index]
        node = server.node_of[index]
        signatures[index] = record_of(send(grid, "market_survivors", {node: request.to_record()})[node])["signature"]
    honest = UnmaskRequest.of(server.survivors, server.dropped)
    attack = dataclasses.replace(honest, signers=neighbours, signatures=[signatures[v] for v in neighbours])
    node = server.node_of[victim]
    reply = send(grid, "market_unmask", {node: attack.to_record()})[node]
    assert reply.has_error()
    assert sum(v not in split for v in neighbours) == t - 1
    assert f"only {t - 1} valid neighbour signatures on this survivor set, the threshold is {t}" in caplog.text


# --- Include and exclude ------------------------------------------------------------------------------------
def test_excluding_nodes_to_shape_a_roster_below_the_nodes_floor_is_refused_by_every_node(tmp_path: Path) -> None:
    """The buyer re-launches excluding two nodes (by id and by their declared tag) so that the roster is smaller
    than the nodes' own floor (``pass-min-participants=7``): each node refuses when the graph comes, before it
    sends a share or a masked input; nothing is released and no node spends its budget on it."""
    grid, counts, directory = secure_grid(
        tmp_path, 8, total_epsilon=4.0, **{"pass-min-participants": 7, "market-min-roster-change": 1}
    )
    nodes = sorted(counts)
    for node in nodes[-1:]:
        context = grid.context(node)
        context.node_config["market-tag"] = "rival"
        grid._contexts[node] = context_to_bytes(context)
    first = MarketPhase(market(directory)).run(grid)
    assert first.status == "succeeded" and len(first.pass_participants) == 8
    spent_before = spent_variances(tmp_path / "flmarket-home")
    with pytest.raises(MarketError) as caught:
        MarketPhase(market(directory, exclude=(nodes[0], "rival"))).run(grid)
    reasons = caught.value.outcome.excluded  # type: ignore[union-attr]
    assert set(nodes[1:-1]) <= set(reasons)
    assert all(reasons[node].startswith("market_share") for node in nodes[1:-1])  # before a share or Y_e leaves
    assert spent_variances(tmp_path / "flmarket-home") == spent_before


# --- Differencing a victim with colluders across re-launches --------------------------------------------
ATTACKS = 8
"""Differencing attacks played, over 30 classes: 240 class errors, whose rms is within about 4.6% of the noise's sd
(one standard error), so a 20% band is over four standard errors."""


def test_relaunching_without_a_victim_and_two_colluders_meets_the_noise_and_the_budget_stops_a_third_release(
    tmp_path: Path, ledger_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The buyer re-launches without the victim and two colluders (a change of 3, which the ledgers allow); the
    colluders add no noise and tell it their counts. ``N_s(1) - N_s(2)`` less their counts is the victim's counts
    plus the honest noise of both sums: 7 honest clients adding ``target / 5`` each in market 1 (a roster of 9),
    6 adding ``target / 3`` in market 2 (a roster of 6), an sd of ``sqrt(7/5 + 2) x 4.65 = 8.6`` per class. Over
    8 attacks of 30 classes the rms error is within 20% of it. Every release is charged: at a budget of 1.6 (two
    releases at epsilon 1 compose to 1.45) a third market over everyone (market 1's sum again, to average its
    noise away) is refused by the budget of every node that released twice, and each ledger holds what the
    accountant says."""
    counts = counts_of(9, seed=7)
    nodes = sorted(counts)
    victim, colluders = nodes[0], nodes[1:3]
    configs, directory = profile_setup(tmp_path, nodes)
    for node in nodes:
        configs[node] |= {"pass-dp-total-epsilon": 1.6}
    errors = []
    for attack in range(ATTACKS):
        monkeypatch.setenv("FLMARKET_HOME", str(ledger_home / f"attack-{attack}"))
        grid = InProcessGrid(colluding_app(counts, colluders), nodes, node_configs=configs, run_id=10 + attack)
        first = MarketPhase(market(directory, num_classes=CLASSES)).run(grid)
        second = MarketPhase(market(directory, num_classes=CLASSES, exclude=(victim, *colluders))).run(grid)
        assert first.status == second.status == "succeeded" and len(second.pass_participants) == 6
        estimate = np.array(first.global_counts) - np.array(second.global_counts) - sum(counts[c] for c in colluders)
        errors.append(estimate - counts[victim])
    noise = SkellamNoise(1.0, SECURE_PROFILE_DELTA, colluders=2)
    predicted = math.sqrt(7 * noise.client_variance(9) + 6 * noise.client_variance(6))
    assert predicted == pytest.approx(math.sqrt(3.4 * noise.target_variance))
    rms = float(np.sqrt(np.mean(np.square(errors))))
    assert 0.8 * predicted <= rms <= 1.2 * predicted
    third = InProcessGrid(colluding_app(counts, colluders), nodes, node_configs=configs, run_id=1000)  # a new run
    with pytest.raises(MarketError) as caught:  # market 1's sum again, its fresh noise to average
        MarketPhase(market(directory, num_classes=CLASSES)).run(third)
    reasons = caught.value.outcome.excluded  # type: ignore[union-attr]
    assert all("privacy budget" in reasons[node] for node in nodes[3:]), reasons
    spent = spent_variances(ledger_home / f"attack-{ATTACKS - 1}")
    # 7 ledgers (the colluders keep none); the victim's second spend is market 3's, write-ahead at mask (its
    # budget had room for it), and nothing was released: the six others refused at the same step
    assert [len(variances) for variances in spent] == [2] * 7
    for variances in spent:
        accountant = noise.epsilon_after(len(variances))  # every client survived: each release cost the target
        assert composed_epsilon(variances, SECURE_PROFILE_DELTA) == pytest.approx(accountant, rel=1e-9)
        assert accountant <= 1.6


def test_including_a_colluder_by_tag_pays_it_from_the_budget_announced_before_pass_and_shows_it_nothing(
    tmp_path: Path,
) -> None:
    """The buyer re-launches including a colluder by its tag at a fixed payment of 600 of its 1000. The bidders
    are told the budget left (400) with the terms before PASS and their award is checked against it; the
    colluder gets no PASS message (no roster, no keys, no sum) and is listed in the award beside the bidders."""
    from flmarket_flwr.market.wire.messages import KEY_BUDGET

    grid, counts, directory = secure_grid(tmp_path, 8, total_epsilon=4.0, **{"market-min-roster-change": 1})
    nodes = sorted(counts)
    colluder = nodes[0]
    context = grid.context(colluder)
    context.node_config["market-tag"] = "partner"
    grid._contexts[colluder] = context_to_bytes(context)
    MarketPhase(market(directory)).run(grid)
    sent_before = len(grid.sent)
    outcome = MarketPhase(market(directory, include={"partner": 600.0})).run(grid)
    assert outcome.status == "succeeded" and outcome.included == {colluder: 600.0}
    later = grid.sent[sent_before:]
    to_colluder = {m.metadata.message_type for m in later if m.metadata.dst_node_id == colluder}
    assert to_colluder <= {"query.market_tags", "query.market_award"}  # told the market closed, nothing else
    adverts = [m for m in later if m.metadata.message_type == "query.market_advertise"]
    assert adverts and all(m.content.config_records["flmarket"][KEY_BUDGET] == 400.0 for m in adverts)
    bidders = {node: pay for node, pay in outcome.payments.items() if node != colluder}
    assert sum(bidders.values()) <= 400.0 + 1e-9
