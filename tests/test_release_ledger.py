"""The node's release ledger (:mod:`flmarket_flwr.market.wire.ledger`): the differencing rule, storage, failures."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from hypothesis import given, settings
from hypothesis import strategies as st

from flmarket_flwr.market.wire.ledger import (
    LEDGER_FILE,
    DrawAllowance,
    LedgerError,
    ReleaseLedger,
    ReleaseRefused,
    RosterHistory,
    SessionCapReached,
    isolates_a_small_group,
    plan_roster,
)

REPO = Path(__file__).resolve().parent.parent
MEMBER_SETS = st.frozensets(st.integers(0, 11), min_size=3, max_size=12)


def ids(members) -> list[bytes]:  # type: ignore[no-untyped-def]
    return [b"node:" + int(m).to_bytes(8, "big") for m in members]


# --- The rule --------------------------------------------------------------------------------------
@given(MEMBER_SETS, MEMBER_SETS, st.integers(1, 6))
def test_the_rule_is_symmetric_and_never_refuses_the_same_set(a: frozenset, b: frozenset, d: int) -> None:
    assert isolates_a_small_group(frozenset(map(str, a)), frozenset(map(str, b)), d) == isolates_a_small_group(
        frozenset(map(str, b)), frozenset(map(str, a)), d
    )
    assert not isolates_a_small_group(frozenset(map(str, a)), frozenset(map(str, a)), d)


@settings(max_examples=40, deadline=None)
@given(st.lists(MEMBER_SETS, min_size=1, max_size=8), st.integers(1, 4), st.integers(0, 2**32 - 1))
def test_no_two_released_sums_difference_to_fewer_than_d_clients(rosters: list[frozenset], d: int, seed: int) -> None:
    """The guarantee, algebraically: for any two sums a node released, ``N_s(P) - N_s(N)`` is
    ``sum(P \\ N) - sum(N \\ P)``, and each side is empty or holds at least ``d`` clients; every refusal has a
    witness among the earlier releases."""
    counts = np.random.default_rng(seed).integers(0, 1000, size=(12, 4))
    released: list[frozenset] = []
    with tempfile.TemporaryDirectory() as folder:
        ledger = ReleaseLedger(folder, min_roster_change=d)
        for run_id, roster in enumerate(rosters):
            try:
                ledger.record_release(run_id, b"s%d" % run_id, ids(roster))
            except ReleaseRefused:
                assert any(0 < len(p - roster) < d or 0 < len(roster - p) < d for p in released)
                continue
            released.append(roster)
    for p, n in combinations(released, 2):
        difference = counts[sorted(p)].sum(axis=0) - counts[sorted(n)].sum(axis=0)
        left, joined = p - n, n - p
        assert np.array_equal(difference, counts[sorted(left)].sum(axis=0) - counts[sorted(joined)].sum(axis=0))
        assert len(left) in (0, *range(d, 13)) and len(joined) in (0, *range(d, 13))


def test_the_two_run_attack_and_its_sybil_variant_are_refused(tmp_path: Path) -> None:
    ledger = ReleaseLedger(tmp_path)
    ledger.record_release(1, b"run-1", ids(range(6)))
    with pytest.raises(ReleaseRefused, match="1 left and 0 joined"):
        ledger.record_release(2, b"run-2", ids(range(1, 6)))  # the victim 0 left
    with pytest.raises(ReleaseRefused, match="1 left and 2 joined"):
        ledger.record_release(2, b"run-2", ids([1, 2, 3, 4, 5, 100, 101]))  # and two sybils joined
    with pytest.raises(ReleaseRefused, match="0 left and 1 joined"):
        ledger.record_release(2, b"run-2", ids(range(7)))  # a newcomer 6 would be isolated
    ledger.record_release(2, b"run-2", ids([3, 4, 5, 6, 7, 8]))  # 3 left, 3 joined
    assert [r.run_id for r in ReleaseLedger(tmp_path).records()] == [1, 2]


def test_recording_the_same_release_again_is_a_no_op_and_another_set_for_it_is_refused(tmp_path: Path) -> None:
    ledger = ReleaseLedger(tmp_path)
    ledger.record_release(1, b"s", ids(range(5)))
    ledger.record_release(1, b"s", ids(range(5)))
    ledger.check(1, b"s", ids(range(5)))
    assert len(ledger.records()) == 1
    with pytest.raises(ReleaseRefused, match="another member set"):
        ledger.record_release(1, b"s", ids(range(10, 15)))


def test_check_records_nothing(tmp_path: Path) -> None:
    ledger = ReleaseLedger(tmp_path)
    ledger.check(1, b"s", ids(range(5)))
    assert ledger.records() == []
    assert not (tmp_path / LEDGER_FILE).exists()


@pytest.mark.parametrize("bad", [0, -1, True, 2.5])
def test_min_roster_change_must_be_a_positive_int(tmp_path: Path, bad: object) -> None:
    with pytest.raises(ValueError, match="min_roster_change"):
        ReleaseLedger(tmp_path, min_roster_change=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="min_roster_change"):
        RosterHistory(tmp_path / "history.json", min_roster_change=bad)  # type: ignore[arg-type]


# --- Storage ---------------------------------------------------------------------------------------
def test_the_file_names_no_member_in_the_clear_and_only_its_owner_reads_it(tmp_path: Path) -> None:
    folder = tmp_path / "ledger"
    ReleaseLedger(folder).record_release(7, b"\x01\x02", ids([123456789, 2, 3]))
    text = (folder / LEDGER_FILE).read_text(encoding="utf-8")
    assert "123456789" not in text and (123456789).to_bytes(8, "big").hex() not in text
    assert stat.S_IMODE(os.stat(folder / LEDGER_FILE).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    data = json.loads(text)
    assert data["records"][0]["run_id"] == 7 and data["records"][0]["session"] == "0102"


@pytest.mark.parametrize(
    "content",
    [
        "",
        '{"version": 1, "salt": "zz"',
        "[]",
        '{"version": 4, "salt": "' + "00" * 32 + '", "records": [], "spent": []}',
        '{"version": 2, "salt": "' + "00" * 32 + '", "records": []}',
        '{"version": 1, "salt": "00", "records": []}',
        '{"version": 1, "salt": "' + "00" * 32 + '", "records": [{"run_id": 1}]}',
        '{"version": 1, "salt": "' + "00" * 32 + '", "records": [{"run_id": 1, "session": "0g", "members": []}]}',
        '{"version": 1, "salt": "' + "00" * 32 + '", "records": [{"run_id": 1, "session": "", "members": ["ab"]}]}',
    ],
    ids=["empty", "truncated", "list", "version", "no-spends", "salt", "no-fields", "session", "member"],
)
def test_a_corrupt_ledger_fails_closed_naming_the_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / LEDGER_FILE
    path.write_text(content, encoding="utf-8")
    ledger = ReleaseLedger(tmp_path)
    for attempt in (ledger.records, lambda: ledger.record_release(1, b"s", ids(range(5)))):
        with pytest.raises(LedgerError, match=f"release ledger {path} is unreadable.*fail closed"):
            attempt()
    assert path.read_text(encoding="utf-8") == content  # never overwritten


def test_a_ledger_directory_that_cannot_be_made_fails_closed(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x", encoding="utf-8")
    with pytest.raises(LedgerError, match="cannot be opened"):
        ReleaseLedger(tmp_path / "file" / "ledger").records()


def test_a_failed_write_leaves_the_old_ledger_whole_and_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = ReleaseLedger(tmp_path)
    ledger.record_release(1, b"s1", ids(range(5)))
    before = (tmp_path / LEDGER_FILE).read_bytes()

    def crash(fd: int) -> None:
        raise OSError(5, "I/O error (simulated crash before the rename)")

    monkeypatch.setattr(os, "fsync", crash)
    with pytest.raises(LedgerError, match="cannot be written"):
        ledger.record_release(2, b"s2", ids(range(10, 15)))
    monkeypatch.undo()
    assert (tmp_path / LEDGER_FILE).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [LEDGER_FILE, "release-ledger.lock"]
    assert len(ReleaseLedger(tmp_path).records()) == 1


_WORKER = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("ledger", sys.argv[1])
ledger_module = sys.modules["ledger"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ledger_module)
ledger, worker = ledger_module.ReleaseLedger(sys.argv[2]), int(sys.argv[3])
for k in range(5):
    base = 1000 * worker + 10 * k
    members = [b"node:" + m.to_bytes(8, "big") for m in range(base, base + 4)]
    ledger.record_release(100 * worker + k, b"w%dk%d" % (worker, k), members)
"""


def _record_many(folder: str, worker: int) -> None:
    ledger = ReleaseLedger(folder)
    for k in range(5):
        base = 1000 * worker + 10 * k
        ledger.record_release(100 * worker + k, b"w%dk%d" % (worker, k), ids(range(base, base + 4)))


def test_concurrent_markets_on_one_node_lose_no_record(tmp_path: Path) -> None:
    """Threads and processes record at once (disjoint member sets, all allowed): every record is kept."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda w: _record_many(str(tmp_path), w), range(4)))
    processes = [  # ledger.py is standard library only: load it alone, no Flower import in the children
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(REPO / "flmarket_flwr/market/wire/ledger.py"), str(tmp_path), str(w)]
        )
        for w in range(4, 8)
    ]
    assert [process.wait(timeout=120) for process in processes] == [0] * 4
    records = ReleaseLedger(tmp_path).records()
    assert sorted(r.run_id for r in records) == sorted(100 * w + k for w in range(8) for k in range(5))


def test_concurrent_conflicting_releases_let_exactly_one_through(tmp_path: Path) -> None:
    """Two markets at once, one the other minus a client: whichever records first, the other is refused."""

    def attempt(run_id: int) -> bool:
        members = range(6) if run_id == 1 else range(1, 6)
        try:
            ReleaseLedger(tmp_path).record_release(run_id, b"r%d" % run_id, ids(members))
        except ReleaseRefused:
            return False
        return True

    with ThreadPoolExecutor(max_workers=2) as pool:
        assert sorted(pool.map(attempt, [1, 2])) == [False, True]


# --- The app's node config -------------------------------------------------------------------------
def test_the_app_reads_the_ledger_from_the_node_config(tmp_path: Path) -> None:
    from flmarket_flwr.market.node.node_config import read_node_settings

    def context(node_config: dict) -> Context:  # type: ignore[type-arg]
        return Context(1, 5, node_config, RecordDict(), {})

    assert read_node_settings(context({"partition-id": 0})).release_ledger is None
    ledger = read_node_settings(
        context({"market-ledger-dir": str(tmp_path), "market-min-roster-change": 4})
    ).release_ledger
    assert ledger is not None and ledger.directory == tmp_path and ledger.min_roster_change == 4
    assert read_node_settings(context({"market-ledger-dir": str(tmp_path)})).release_ledger.min_roster_change == 3  # type: ignore[union-attr]


def test_the_app_reads_the_complete_graph_requirement_from_the_node_config() -> None:
    from flmarket_flwr.market.node.node_config import read_node_settings

    def context(node_config: dict) -> Context:  # type: ignore[type-arg]
        return Context(1, 5, node_config, RecordDict(), {})

    assert read_node_settings(context({})).complete_graph is False
    assert read_node_settings(context({"pass-complete-graph": True})).complete_graph is True
    assert read_node_settings(context({"pass-complete-graph": "true"})).complete_graph is True
    assert read_node_settings(context({"pass-complete-graph": False})).complete_graph is False
    with pytest.raises(ValueError, match="pass-complete-graph"):
        read_node_settings(context({"pass-complete-graph": "yes please"}))


def test_the_app_reads_the_roster_floor_and_the_split_tolerance_from_the_node_config() -> None:
    from flmarket_flwr.market.node.node_config import read_node_settings

    def context(node_config: dict) -> Context:  # type: ignore[type-arg]
        return Context(1, 5, node_config, RecordDict(), {})

    assert read_node_settings(context({})).min_participants == 3
    assert read_node_settings(context({"pass-min-participants": 90})).min_participants == 90
    assert read_node_settings(context({"pass-min-participants": "90"})).min_participants == 90
    assert read_node_settings(context({"pass-min-participants": " 3 "})).min_participants == 3
    for bad in (2, 0, -90, "2", "ninety", "90.0", "", "-90", "٩٠", 90.0, True, None, [90]):
        with pytest.raises(ValueError, match="pass-min-participants"):
            read_node_settings(context({"pass-min-participants": bad}))
    assert read_node_settings(context({})).split_tolerance == 0
    assert read_node_settings(context({"pass-split-tolerance": 4})).split_tolerance == 4
    assert read_node_settings(context({"pass-split-tolerance": " 0 "})).split_tolerance == 0
    for bad in (-1, "-1", "two", "2.0", "", 2.0, True, False, None, [2]):
        with pytest.raises(ValueError, match="pass-split-tolerance"):
            read_node_settings(context({"pass-split-tolerance": bad}))


# --- The buyer's side ------------------------------------------------------------------------------
@settings(max_examples=100, deadline=None)
@given(st.frozensets(st.integers(0, 15), max_size=16), st.lists(MEMBER_SETS, max_size=6), st.integers(1, 5))
def test_a_planned_roster_is_refused_by_no_ledger(candidates: frozenset, releases: list, d: int) -> None:
    roster = plan_roster(candidates, releases, d)
    assert set(roster) <= candidates and roster == sorted(roster)
    assert len(roster) >= 3 or roster == []
    for members in releases:  # every ledger that holds a release and is asked for the roster accepts it
        if members & set(roster):
            assert not isolates_a_small_group(frozenset(members), frozenset(roster), d)


def test_plan_roster_leaves_out_a_few_instead_of_losing_the_market() -> None:
    assert plan_roster(range(6), [range(6)]) == list(range(6))  # the same members: nothing new
    assert plan_roster(range(1, 6), [range(6)]) == [1, 2, 3]  # victim 0 gone: 4 and 5 sit out too
    assert plan_roster(range(7), [range(6)]) == list(range(6))  # one newcomer would be isolated: it waits
    assert plan_roster(range(3, 9), [range(6)]) == list(range(3, 9))  # 3 left, 3 joined: as is
    assert plan_roster(range(1, 3), []) == []
    assert plan_roster(range(10, 20), [range(3)], 5) == list(range(10, 20))  # disjoint: no ledger compares them


@settings(max_examples=60, deadline=None)
@given(st.lists(st.frozensets(st.integers(0, 11), min_size=3, max_size=12), min_size=1, max_size=6), st.integers(1, 4))
def test_markets_planned_through_a_roster_history_are_refused_by_no_node(presences: list, d: int) -> None:
    """Churn: each market plans its roster from the history of the ones before; no node ever has cause to refuse."""
    with tempfile.TemporaryDirectory() as folder:
        history = RosterHistory(Path(folder) / "history.json", min_roster_change=d)
        released: dict[int, list[frozenset[int]]] = {}  # each node's own ledger, as member sets
        for present in presences:
            roster = frozenset(history.plan(present))
            assert roster <= present
            for node in roster:
                assert not any(isolates_a_small_group(earlier, roster, d) for earlier in released.get(node, []))
            if roster:
                history.record(roster)
                for node in roster:
                    released.setdefault(node, []).append(roster)
        assert history.releases() == _planned(presences, d)


def _planned(presences: list, d: int) -> list[frozenset[int]]:
    """The same plans made with ``plan_roster`` alone (consecutive repeats recorded once)."""
    releases: list[frozenset[int]] = []
    for present in presences:
        roster = frozenset(plan_roster(present, releases, d))
        if roster and (not releases or releases[-1] != roster):
            releases.append(roster)
    return releases


def test_a_roster_history_is_private_to_its_owner_and_records_a_repeat_once(tmp_path: Path) -> None:
    history = RosterHistory(tmp_path / "buyer" / "history.json")
    assert history.releases() == [] and history.plan([5, 6, 7]) == [5, 6, 7]
    history.record([7, 5, 6])
    history.record([5, 6, 7])
    assert history.releases() == [frozenset({5, 6, 7})]
    assert stat.S_IMODE(os.stat(history.path).st_mode) == 0o600
    assert [p.name for p in history.path.parent.iterdir() if p.suffix == ".tmp"] == []
    assert history.plan([5, 6]) == []  # one left: a group of 1, so nobody (fewer than 3 would be left anyway)


@pytest.mark.parametrize(
    "content",
    ['{"version": 1, "releases": [[1, "2"]]}', '{"version": 2, "releases": []}', "[]", "{"],
    ids=["not-an-id", "version", "not-an-object", "not-json"],
)
def test_a_corrupt_roster_history_is_an_error_naming_the_file(tmp_path: Path, content: str) -> None:
    path = tmp_path / "history.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(LedgerError, match=f"roster history {path} is unreadable"):
        RosterHistory(path).plan([1, 2, 3])


@settings(max_examples=60, deadline=None)
@given(
    per_release=st.integers(1, 4),
    markets=st.integers(1, 4),
    events=st.lists(st.tuples(st.sampled_from(["draw", "mask", "release", "wait"]), st.integers(1, 3)), max_size=30),
)
def test_the_draw_allowance_bounds_the_placements_by_releases_waits_and_the_nodes_life(
    per_release: int, markets: int, events: list, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The sparse secure mode's allowance, whatever a buyer starts, in whatever runs: the sessions a node draws in
    (each checked and recorded before the draw leaves) never exceed ``per_release x markets`` over its life, and
    since its last release never more than ``per_release`` within one wait; a draw refused for the wait is allowed
    once the wait has passed (while the life lasts); a session counted already passes again (a retried message), and
    a check records nothing."""
    ledger, wait = ReleaseLedger(tmp_path_factory.mktemp("cap")), 100.0
    allowance = DrawAllowance(per_release, per_release * markets, wait)
    drawn: list[tuple[int, bytes, float]] = []
    released_at = -1  # the index in `drawn` of the last draw whose session was released
    now = 0.0
    for number, (event, run) in enumerate(events):
        if event in ("draw", "mask"):
            session = b"s%d" % number
            pending = [at for at in (t for _, _, t in drawn[released_at + 1 :]) if at > now - wait]
            try:
                ledger.check_session_cap(run, session, allowance, now=now)
                ledger.record_draw(run, session, allowance, now=now)
            except SessionCapReached:
                assert len(drawn) >= allowance.lifetime or len(pending) >= per_release
                continue
            assert len(drawn) < allowance.lifetime and len(pending) < per_release  # refused only past one of them
            drawn.append((run, session, now))
            ledger.record_draw(run, session, allowance, now=now)  # the same draw again: a retry, it passes
            if event == "mask":
                ledger.spend(run, session, 0.0)
        elif event == "release" and drawn:  # the last session drawn released its sum
            ledger.record_release(*drawn[-1][:2], [b"key:%d" % i for i in range(5)])
            released_at = len(drawn) - 1
        elif event == "wait":
            now += wait * run / 2  # half a wait, one, or one and a half
        assert len(drawn) <= allowance.lifetime


def test_a_version_3_ledger_reads_its_draws_as_made_long_ago(tmp_path: Path) -> None:
    """Draws recorded before their time was (version 3) still count over the node's life, and none within a wait: the
    node draws again at once, and a draw it records now carries its time."""
    drawn = [{"run_id": 1, "session": f"{i:02x}"} for i in range(3)]
    content = {"version": 3, "salt": "00" * 32, "records": [], "spent": [], "drawn": drawn}
    (tmp_path / LEDGER_FILE).write_text(json.dumps(content), encoding="utf-8")
    ledger = ReleaseLedger(tmp_path)
    ledger.record_draw(2, b"new", DrawAllowance(1, 4, 3600.0), now=1e9)
    with pytest.raises(SessionCapReached, match="the 4 placements its sparse secure degrees are sized for"):
        ledger.check_session_cap(2, b"later", DrawAllowance(4, 4, 0.0), now=2e9)
    with pytest.raises(SessionCapReached, match="it draws again after a release or in 3600 s"):
        ledger.check_session_cap(2, b"later", DrawAllowance(1, 10, 3600.0), now=1e9)
    data = json.loads((tmp_path / LEDGER_FILE).read_text(encoding="utf-8"))
    assert data["version"] == 4 and data["drawn"][-1] == {"run_id": 2, "session": b"new".hex(), "time": 1e9}
    assert [item.get("time", 0.0) for item in data["drawn"][:3]] == [0.0, 0.0, 0.0]
