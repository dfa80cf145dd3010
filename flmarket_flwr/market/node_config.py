"""The market's node-config schema, the readers of its keys, and a ``ClientApp`` mod that checks a node config.

Each key is one a SuperNode's operator sets for the market, with its type, default, check and meaning. The mod
refuses an unknown key, a run-config key, or a value that cannot work. An app declares its own keys and builds
its schema (``MARKET_SCHEMA.extended(app_keys, run_config_keys=...)``); ``python -m
flmarket_flwr.market.node_config`` prints the market's keys.
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from logging import WARNING
from pathlib import Path
from typing import Any, Final, NoReturn

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import Context, Error, Message
from flwr.common.constant import ErrorCode
from flwr.supercore import log

from flmarket_flwr.market.config import SECURITY_PROFILES, profile_colluders
from flmarket_flwr.market.config_keys import Scalar, at_least, check_value, one_of, typed_value
from flmarket_flwr.market.ledger import DEFAULT_MIN_ROSTER_CHANGE, ReleaseLedger
from flmarket_flwr.pass_protocol.identity import (
    IdentityDirectory,
    load_directory,
    load_identity_key,
    parse_digest,
    parse_public_key,
)
from flmarket_flwr.pass_protocol.noise import (
    MIN_HONEST_CLIENTS,
    SECURE_PROFILE_DELTA,
    SECURE_PROFILE_EPSILON,
    SECURE_PROFILE_TOTAL_EPSILON,
    PrivacyBudget,
    SkellamNoise,
)
from flmarket_flwr.pass_protocol.primitives import MIN_PARTICIPANTS

__all__ = [
    "MARKET_NODE_KEYS",
    "MARKET_SCHEMA",
    "NodeConfigCheck",
    "NodeConfigSchema",
    "NodeKey",
    "buyer_key_of",
    "check_noise_ceiling",
    "colluders_of",
    "complete_graph_of",
    "identity_directory_of",
    "identity_key_of",
    "market_tag_of",
    "min_participants_of",
    "node_noise_of",
    "noise_ceiling_of",
    "release_ledger_of",
    "security_of",
    "privacy_budget_of",
    "split_tolerance_of",
]

_TRUE_FALSE: Final = {"true": True, "false": False}
PROFILE_ROSTER_SHARE: Final = 2 / 3
"""The secure profile's roster floor, as a share of the pinned directory (when ``pass-min-participants`` is unset)."""
PROFILE_SPLIT_TOLERANCE: Final = 2
"""The secure profile's ``pass-split-tolerance`` when unset: two colluders cannot split the consistency round."""
LEDGER_HOME_ENV: Final = "FLMARKET_HOME"
"""Where the secure profile keeps a node's ledger when ``market-ledger-dir`` is unset (default ``~/.flmarket``)."""


@dataclass(frozen=True)
class NodeKey:
    """One node-config key.

    Attributes
    ----------
    name : str
        The key as ``--node-config`` writes it (``-`` separated).
    kind : type
        ``bool``, ``int``, ``float`` or ``str``.
    default : bool, int, float, str or None
        Its value when absent; ``None``: no default (whoever reads it requires it).
    meaning : str
        What it does, one line.
    check : callable, optional
        ``value -> bool``: whether a well-typed value can work.
    expected : str
        What :attr:`check` asks for, for the error message.
    """

    name: str
    kind: type
    default: Scalar | None
    meaning: str
    check: Callable[[Any], bool] | None = None
    expected: str = ""

    def parse(self, value: Any) -> Scalar:
        """``value`` typed and checked; a ``ValueError`` naming the key otherwise.

        Node-config values may arrive as strings (a quoted ``--node-config`` value): ``"true"``/``"false"`` for a
        bool, ASCII digits for an int, a decimal for a float are read as such; anything else is refused, so that a
        typo never silently leaves the node at the default.
        """
        if isinstance(value, str) and self.kind is not str:
            value = _from_text(value.strip(), self.kind)
        typed = typed_value("node", self.name, value, self.kind, self.default)
        check_value("node", self.name, typed, self.check, self.expected)
        return typed


def _from_text(text: str, kind: type) -> Any:
    """``text`` as a ``kind`` where it spells one exactly, else unchanged (then refused by its type)."""
    if kind is bool and text.lower() in _TRUE_FALSE:
        return _TRUE_FALSE[text.lower()]
    if kind is int and text.isascii() and text.isdigit():
        return int(text)
    if kind is float:
        try:
            return float(text)
        except ValueError:
            return text
    return text


def _finite_at_least_zero(value: float) -> bool:
    return 0.0 <= value < math.inf


def _hex_digest_or_empty(value: str) -> bool:
    return _parses(parse_digest, value)


def _public_key_or_empty(value: str) -> bool:
    return _parses(parse_public_key, value)


def _parses(parse: Callable[[str, str], bytes], value: str) -> bool:
    if not value:
        return True
    try:
        parse(value, "")
    except ValueError:
        return False
    return True


MARKET_NODE_KEYS: Final[tuple[NodeKey, ...]] = (
    # The profile: one key that turns on every defence the threat model needs against a malicious server.
    NodeKey("market-security", str, "semi-honest", "semi-honest, or malicious: the secure profile (identity key, "
            "pinned directory, complete graph, roster floor, split tolerance, noise, budget, ledger)",
            one_of(("semi_honest", "malicious")), f"one of {list(SECURITY_PROFILES)}"),
    # Identity: the node's key, and the directory it checks its neighbours against, pinned.
    NodeKey("identity-key", str, "", 'path of this node\'s Ed25519 identity key (PKCS#8 PEM); "" signs nothing'),
    NodeKey("identity-directory", str, "", 'path of the directory of identity keys (JSON) the node checks its '
            'neighbours against; "" for none'),
    NodeKey("identity-directory-digest", str, "", "SHA-256 (64 hex) of the directory this node trusts "
            '(identity_cli digest); "" for none', _hex_digest_or_empty, '64 hex digits, or ""'),
    NodeKey("identity-directory-signer", str, "", "Ed25519 public key (64 hex) of the third party that must have "
            'signed the directory; "" for none', _public_key_or_empty, 'an Ed25519 public key in 64 hex digits, or ""'),
    NodeKey("identity-directory-unpinned", bool, False, "true: take the directory with neither pin (only where "
            "this node's operator wrote it, never the buyer)"),
    NodeKey("market-tag", str, "", 'a label the buyer may include or exclude this node by (run config market-include '
            '/ market-exclude "tag:<label>"); the node\'s own word, sent to the buyer before a market that asks; '
            '"" for none'),
    NodeKey("market-buyer-key", str, "", 'the buyer\'s Ed25519 public key (64 hex) this node pins; "" for none',
            _public_key_or_empty, 'an Ed25519 public key in 64 hex digits, or ""'),
    # PASS: the rosters and graphs the node takes part in.
    NodeKey("pass-complete-graph", bool, False, "true: take part in PASS only on the complete graph"),
    NodeKey("pass-min-participants", int, MIN_PARTICIPANTS, "the smallest PASS roster the node takes part in",
            at_least(MIN_PARTICIPANTS), f">= {MIN_PARTICIPANTS}"),
    NodeKey("pass-colluders", int, 0, "colluding clients (the buyer's allies: they add no noise and share what "
            "they see) the node's guarantees assume at most; the secure profile: a fifth of the pinned directory",
            at_least(0), ">= 0"),
    NodeKey("pass-split-tolerance", int, 0, "colluding neighbours the node's secrets withstand in a split "
            "consistency round (raises its Shamir threshold)", at_least(0), ">= 0"),
    # Releases: the node's ledger and its noise.
    NodeKey("market-ledger-dir", str, "", 'folder of the node\'s release ledger; "" for none'),
    NodeKey("market-min-roster-change", int, DEFAULT_MIN_ROSTER_CHANGE, "smallest group two releases of the "
            "node's counts may differ by (with market-ledger-dir)", at_least(1), ">= 1"),
    NodeKey("pass-dp-max-epsilon", float, 0.0, "refuse a run whose pass-dp-* noise is weaker than this epsilon "
            "needs; 0: no ceiling", _finite_at_least_zero, ">= 0 and finite (0: none)"),
    NodeKey("pass-dp-total-epsilon", float, 0.0, "the node's epsilon over all its releases, composed (kept in "
            "market-ledger-dir); 0: no budget", _finite_at_least_zero, ">= 0 and finite (0: none)"),
    NodeKey("pass-dp-total-delta", float, SECURE_PROFILE_DELTA, "the delta pass-dp-total-epsilon is counted at",
            lambda value: 0.0 < value < 1.0, "in (0, 1)"),
)  # fmt: skip
"""Every node-config key of the market."""


class NodeConfigSchema:
    """The node-config keys one ``ClientApp`` reads: the market's and the app's own.

    Parameters
    ----------
    keys : iterable of NodeKey
        The keys (names must be unique).
    run_config_keys : iterable of str
        The app's run-config keys: given as node config, each is refused with an error that says so (a name
        that is also a node-config key, such as ``identity-directory``, names each side's own setting).

    Raises
    ------
    ValueError
        If two keys share a name.
    """

    def __init__(self, keys: Iterable[NodeKey], *, run_config_keys: Iterable[str] = ()) -> None:
        self.keys: tuple[NodeKey, ...] = tuple(keys)
        self._by_name = {key.name: key for key in self.keys}
        if len(self._by_name) != len(self.keys):
            raise ValueError("two node-config keys share one name")
        self.run_config_keys = frozenset(run_config_keys) - set(self._by_name)  # a name on both sides is a node key

    def extended(self, keys: Iterable[NodeKey], *, run_config_keys: Iterable[str] = ()) -> NodeConfigSchema:
        """This schema with an app's own keys and its run-config keys added."""
        return NodeConfigSchema((*self.keys, *keys), run_config_keys=self.run_config_keys | set(run_config_keys))

    def value(self, node_config: Mapping[str, Any], name: str) -> Scalar | None:
        """Key ``name`` of ``node_config``, typed and checked, or its default when absent."""
        key = self._by_name[name]
        return key.parse(node_config[name]) if name in node_config else key.default

    def check(self, node_config: Mapping[str, Any]) -> dict[str, Scalar | None]:
        """The whole node config, typed and checked, with every absent key at its default.

        Raises
        ------
        ValueError
            For a run-config key given as node config, an unknown key, or a value of the wrong type or that its
            check refuses, naming the key.
        """
        misplaced = sorted(set(node_config) & self.run_config_keys)
        if misplaced:
            raise ValueError(
                f"node-config key(s) {misplaced} are run-config keys: a SuperNode's node config does not set them; "
                "give them with flwr run --run-config"
            )
        unknown = sorted(set(node_config) - set(self._by_name))
        if unknown:
            raise ValueError(
                f"unknown node-config key(s) {unknown}: python -m flmarket_flwr.market.node_config lists the market's"
            )
        return {key.name: self.value(node_config, key.name) for key in self.keys}

    def markdown(self) -> str:
        """The keys as a Markdown table (key, type, default, meaning, what a value must be)."""
        lines = ["| key | type | default | meaning | a value must be |", "| --- | --- | --- | --- | --- |"]
        for key in self.keys:
            shown = "(required)" if key.default is None else _shown(key.default)
            meaning = key.meaning.replace("|", "\\|")
            lines.append(f"| `{key.name}` | {key.kind.__name__} | `{shown}` | {meaning} | {key.expected or 'any'} |")
        return "\n".join(lines) + "\n"

    def table(self) -> str:
        """The keys as ``--node-config`` takes them, one per line with its default and meaning."""
        width = max(len(key.name) for key in self.keys)
        lines = []
        for key in self.keys:
            shown = "(required)" if key.default is None else _shown(key.default)
            lines.append(f"{key.name:<{width}}  {key.kind.__name__:<5}  {shown:<10}  {key.meaning}")
        return "\n".join(lines) + "\n"


def _shown(value: Scalar) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return '""' if value == "" else str(value)


MARKET_SCHEMA: Final = NodeConfigSchema(MARKET_NODE_KEYS)
"""The market's node-config keys alone (an app extends it with its own: :meth:`NodeConfigSchema.extended`)."""


class NodeConfigCheck:
    """``ClientApp`` mod: every message is refused while the node config fails ``schema`` (:meth:`~.check`).

    The reason goes to the node's own log; the server gets a generic error. A module-level class, so that Ray can
    pickle the ``ClientApp`` that carries it.
    """

    def __init__(self, schema: NodeConfigSchema) -> None:
        self.schema = schema

    def __call__(self, msg: Message, context: Context, call_next: Any) -> Message:
        """Check the node config, then run the next mod or the handler."""
        try:
            self.schema.check(context.node_config)
        except ValueError as error:
            log(WARNING, "Message %s refused: %s", msg.metadata.message_type, error)
            reason = f"flmarket: {msg.metadata.message_type}: the node's config is refused (see the node's log)"
            return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=msg)
        return call_next(msg, context)


# --- Readers: one per market key, each through the schema ---------------------------------------------------------
def _value(context: Context, name: str) -> Any:
    return MARKET_SCHEMA.value(context.node_config, name)


def _is_set(context: Context, name: str) -> bool:
    return name in context.node_config


def security_of(context: Context) -> str:
    """The node's profile (``market-security``): ``"semi-honest"`` (default) or ``"malicious"``.

    In the secure profile (``malicious``) every reader below turns on what the threat model needs against a
    malicious server, and refuses a node config that would weaken it, naming the key:

    * ``identity-key`` and ``identity-directory`` are required, and the directory must be pinned
      (``identity-directory-digest`` or ``-signer``; ``identity-directory-unpinned`` is refused);
    * ``pass-complete-graph`` is on (``false`` is refused);
    * ``pass-min-participants`` defaults to two thirds of the pinned directory, ``pass-split-tolerance`` to 2;
    * noise on the counts: at least epsilon :data:`SECURE_PROFILE_EPSILON` per release (``pass-dp-max-epsilon``
      defaults to it), within a composed budget (``pass-dp-total-epsilon`` defaults to
      :data:`SECURE_PROFILE_TOTAL_EPSILON`), kept in the node's release ledger, which defaults to
      ``$FLMARKET_HOME/ledger/<identity key fingerprint>`` (``~/.flmarket`` without ``FLMARKET_HOME``).
    """
    return str(_value(context, "market-security")).lower().replace("_", "-")


def _secure(context: Context) -> bool:
    return security_of(context) == "malicious"


def _profile_requires(name: str) -> NoReturn:
    raise ValueError(f"node-config market-security=malicious needs {name}: set it in the SuperNode's --node-config")


def identity_key_of(context: Context) -> Ed25519PrivateKey | None:
    """The node's Ed25519 identity key, from the PEM file named by ``identity-key`` (``None``: none)."""
    path = _value(context, "identity-key")
    if not path and _secure(context):
        _profile_requires("identity-key (identity_cli keygen makes one)")
    return load_identity_key(path) if path else None


def identity_directory_of(context: Context) -> IdentityDirectory | None:
    """The directory of identity keys named by ``identity-directory``, checked against the node's pins.

    The node pins the directory it trusts: ``identity-directory-digest`` (its SHA-256) and/or
    ``identity-directory-signer`` (the key of the third party that signs it). A directory with neither pin is
    refused unless ``identity-directory-unpinned`` is true: the buyer must not be able to write what the node
    trusts. ``None`` without ``identity-directory``.

    Raises
    ------
    ValueError
        Naming the node-config keys, if the directory is unreadable, fails a pin, or has none.
    """
    path = _value(context, "identity-directory")
    digest, signer = _value(context, "identity-directory-digest"), _value(context, "identity-directory-signer")
    if _secure(context):
        if not path:
            _profile_requires("identity-directory, pinned by identity-directory-digest or -signer")
        if _value(context, "identity-directory-unpinned"):
            raise ValueError("node-config identity-directory-unpinned is refused with market-security=malicious: "
                             "pin the directory by identity-directory-digest or -signer")  # fmt: skip
    if not path:
        if digest or signer:
            raise ValueError("node-config identity-directory-digest/-signer pin a directory, but identity-directory "
                             "names none: refused")  # fmt: skip
        return None
    try:
        return load_directory(
            Path(path).expanduser(),
            digest=parse_digest(digest, "identity-directory-digest") if digest else None,
            signer=parse_public_key(signer, "identity-directory-signer") if signer else None,
            unpinned=_value(context, "identity-directory-unpinned"),
        )
    except (OSError, ValueError) as error:
        keys = [name for name, value in (("identity-directory-digest", digest), ("identity-directory-signer", signer))]
        pinned = [name for name in keys if _value(context, name)]
        hint = "" if pinned else "; set identity-directory-digest or identity-directory-signer"
        raise ValueError(f"node-config {'/'.join(pinned) or 'identity-directory'}: {error}{hint}") from error


def market_tag_of(context: Context) -> str:
    """The node's ``market-tag`` (``""``: none)."""
    return str(_value(context, "market-tag"))


def buyer_key_of(context: Context) -> bytes | None:
    """The buyer's Ed25519 public key the node pins (``market-buyer-key``, 32 bytes; ``None``: none)."""
    text = _value(context, "market-buyer-key")
    return parse_public_key(text, "market-buyer-key") if text else None


def complete_graph_of(context: Context) -> bool:
    """Whether the node takes part in PASS only on the complete graph (``pass-complete-graph``; always in the
    secure profile, where an explicit ``false`` is refused)."""
    if _secure(context):
        if _is_set(context, "pass-complete-graph") and not _value(context, "pass-complete-graph"):
            raise ValueError("node-config pass-complete-graph=false is refused with market-security=malicious")
        return True
    return bool(_value(context, "pass-complete-graph"))


def min_participants_of(context: Context) -> int:
    """The smallest PASS roster the node takes part in (``pass-min-participants``, default 3).

    The server chooses whom it invites, so the complete graph (:func:`complete_graph_of`) protects a node only
    when this is close to the size of the federation it expects. In the secure profile it defaults to two thirds
    of the pinned directory (rounded up): seating the node among ``t`` colluders on the complete graph then takes
    about a third of the federation.

    Raises
    ------
    ValueError
        Naming ``pass-colluders``, if the floor admits a roster with fewer than
        :data:`~flmarket_flwr.pass_protocol.noise.MIN_HONEST_CLIENTS` clients beside the assumed colluders.
    """
    if _secure(context) and not _is_set(context, "pass-min-participants"):
        directory = identity_directory_of(context)
        size = len(directory) if directory is not None else 0
        floor = max(MIN_PARTICIPANTS, math.ceil(PROFILE_ROSTER_SHARE * size - 1e-9))
    else:
        floor = int(_value(context, "pass-min-participants"))
    colluders = colluders_of(context)
    if floor < colluders + MIN_HONEST_CLIENTS:
        raise ValueError(
            f"node-config pass-colluders {colluders} needs rosters of at least {colluders + MIN_HONEST_CLIENTS} "
            f"({MIN_HONEST_CLIENTS} honest clients beside the colluders), but the roster floor "
            f"pass-min-participants is {floor}: raise pass-min-participants or lower pass-colluders"
        )
    return floor


def colluders_of(context: Context) -> int:
    """How many colluding clients the node's guarantees assume at most (``pass-colluders``; default 0).

    A colluder is a client allied with the buyer: it adds no noise, endorses whatever the buyer asks, and shares
    what it sees. The node sizes its noise so that the honest clients' noise alone reaches its epsilon, counts
    an award as binding only with a majority that this many colluders cannot make twice, and refuses a roster
    too small for the assumption (docs/threat-model.md). In the secure profile it defaults to
    :func:`~flmarket_flwr.market.config.profile_colluders` of the pinned directory (a fifth, rounded up), the
    number the buyer's ``pass-reruns`` outlasts by default.
    """
    if _secure(context) and not _is_set(context, "pass-colluders"):
        directory = identity_directory_of(context)
        size = len(directory) if directory is not None else 0
        return profile_colluders(size)
    return int(_value(context, "pass-colluders"))


def split_tolerance_of(context: Context) -> int:
    """How many colluding neighbours the node's PASS secrets withstand in a split consistency round
    (``pass-split-tolerance``, default 0: the protocol's own threshold).

    It raises the Shamir threshold of the node's secrets
    (:func:`~flmarket_flwr.pass_protocol.graph.secret_threshold`), at the price of fewer neighbours that may drop.
    In the secure profile it defaults to :data:`PROFILE_SPLIT_TOLERANCE`.
    """
    if _secure(context) and not _is_set(context, "pass-split-tolerance"):
        return PROFILE_SPLIT_TOLERANCE
    return int(_value(context, "pass-split-tolerance"))


def release_ledger_of(context: Context) -> ReleaseLedger | None:
    """The node's release ledger in the folder named by ``market-ledger-dir`` (``None``: none).

    ``market-min-roster-change`` (default 3) is the smallest group two releases may differ by; the ledger also
    keeps the node's privacy spends when it has a budget (:func:`privacy_budget_of`). Off by default: a
    simulation's nodes are not lasting parties, and the operator of each SuperNode chooses where its state lives.
    """
    path = _value(context, "market-ledger-dir")
    budget = privacy_budget_of(context)
    if not path and _secure(context):
        path = str(_profile_ledger_dir(context))
    if not path:
        if budget is not None:
            raise ValueError("node-config pass-dp-total-epsilon needs market-ledger-dir, where the spends are kept")
        return None
    return ReleaseLedger(path, min_roster_change=int(_value(context, "market-min-roster-change")), budget=budget)


def noise_ceiling_of(context: Context) -> float:
    """The node's own epsilon ceiling (``pass-dp-max-epsilon``; 0: none; the secure profile's epsilon when unset
    there)."""
    if _secure(context) and not _is_set(context, "pass-dp-max-epsilon"):
        return SECURE_PROFILE_EPSILON
    return float(_value(context, "pass-dp-max-epsilon"))


def privacy_budget_of(context: Context) -> PrivacyBudget | None:
    """The node's total privacy budget (``pass-dp-total-epsilon`` at ``pass-dp-total-delta``; ``None``: none).

    The node's release ledger records each release's noise before its masked input leaves and refuses the release
    that would take the composed epsilon past the budget (:meth:`~flmarket_flwr.market.ledger.ReleaseLedger.spend`).
    """
    epsilon = float(_value(context, "pass-dp-total-epsilon"))
    if _secure(context) and not _is_set(context, "pass-dp-total-epsilon"):
        epsilon = SECURE_PROFILE_TOTAL_EPSILON
    return PrivacyBudget(epsilon, float(_value(context, "pass-dp-total-delta"))) if epsilon > 0 else None


def check_noise_ceiling(noise: SkellamNoise | None, context: Context) -> SkellamNoise | None:
    """``noise`` (a run's announced setting), unless it is weaker than the node's ``pass-dp-max-epsilon`` needs.

    With a ceiling, the node refuses to mask in a run that announces no noise, a larger epsilon, or less noise
    than its ceiling needs at delta 1e-6 with half the roster honest (a larger delta or honest fraction).

    Raises
    ------
    ValueError
        Naming ``pass-dp-max-epsilon``, if the noise falls short.
    """
    ceiling = noise_ceiling_of(context)
    if ceiling > 0:
        floor = SkellamNoise(ceiling)  # the noise the node's ceiling needs: delta 1e-6, half the roster honest
        if (
            noise is None
            or noise.epsilon > ceiling
            or noise.target_variance < floor.target_variance
            or noise.honest_fraction > floor.honest_fraction
        ):
            raise ValueError(f"the run's pass-dp-* noise is below this node's pass-dp-max-epsilon {ceiling}: refused")
    return noise


def node_noise_of(context: Context, announced: SkellamNoise | None = None) -> SkellamNoise | None:
    """The noise this node adds to its counts: the run's ``announced`` setting, checked against its ceiling.

    In the secure profile a run that announces no noise still gets the profile's (epsilon
    :data:`SECURE_PROFILE_EPSILON`, delta :data:`SECURE_PROFILE_DELTA`): the node adds it itself, whatever the
    server says; a weaker announcement is refused (:func:`check_noise_ceiling`).
    The node sizes it for its own ``pass-colluders`` (:func:`colluders_of`; a run may announce more, never
    fewer): the honest clients' noise alone reaches the epsilon with that many colluders adding none.

    Raises
    ------
    ValueError
        Naming ``pass-dp-max-epsilon``, if the announced noise is weaker than the node's ceiling.
    """
    if announced is None and _secure(context):
        announced = SkellamNoise(SECURE_PROFILE_EPSILON, SECURE_PROFILE_DELTA)
    noise = check_noise_ceiling(announced, context)
    colluders = colluders_of(context)
    if noise is not None and noise.colluders < colluders:
        noise = replace(noise, colluders=colluders)
    return noise


def _profile_ledger_dir(context: Context) -> Path:
    """``$FLMARKET_HOME/ledger/<first 16 hex of SHA-256 of the identity public key>``: one folder per identity."""
    key = identity_key_of(context)  # the secure profile requires it: raises without one
    if key is None:
        _profile_requires("identity-key")
    public = key.public_key().public_bytes_raw()
    home = Path(os.environ.get(LEDGER_HOME_ENV, "~/.flmarket")).expanduser()
    return home / "ledger" / hashlib.sha256(public).hexdigest()[:16]


if __name__ == "__main__":
    import sys

    print(MARKET_SCHEMA.markdown() if sys.argv[1:] == ["--markdown"] else MARKET_SCHEMA.table(), end="")
