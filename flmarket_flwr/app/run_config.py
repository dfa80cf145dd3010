"""The app's run-config schema: every key once, with its type, default, check and meaning.

``[tool.flwr.app.config]`` in ``pyproject.toml`` (what ``flwr run`` reads) restates :data:`APP_KEYS`
(``python -m flmarket_flwr.app.run_config`` prints the block; a test holds the two equal). Each boundary's settings
(the ServerApp's, the ClientApp's, the data config, the train message, the engine's job) subclass a frozen
dataclass whose source is generated from it (:data:`APP_SETTINGS_FIELDS`, written to
:mod:`flmarket_flwr.app.settings_fields` by ``python -m flmarket_flwr.app.run_config --python``; a test holds the
file equal), so a type checker sees every field; Hydra's ``conf/`` reads the schema as a structured config. The keys
the plugin also takes (the market's, the simulated bids') default to the plugin's own defaults. An app built on
this one (the experiments, :mod:`simulations.run_config`) extends :data:`APP_SCHEMA` with its own keys.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import re
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeVar

from flmarket_flwr.app.data.partition import DEFAULT_SCHEDULE, DISTRIBUTIONS, SCHEDULES
from flmarket_flwr.app.data.registry import DATASET_NAMES, canonical_dataset_name
from flmarket_flwr.market.buyer.config import MarketConfig
from flmarket_flwr.market.buyer.membership import Member, parse_node_ids
from flmarket_flwr.market.buyer.relaunch import RelaunchPolicy
from flmarket_flwr.market.node.bidding import SimulatedCostBid
from flmarket_flwr.market.wire.config_keys import Scalar, check_value, typed_value
from flmarket_flwr.market.wire.config_keys import at_least as _at_least
from flmarket_flwr.market.wire.config_keys import one_of as _one_of
from flmarket_flwr.market.wire.config_keys import positive as _positive
from flmarket_flwr.pass_protocol.noise import SkellamNoise
from flmarket_flwr.pricing import BUDGET_RULES

__all__ = [
    "APP_KEYS",
    "APP_SCHEMA",
    "APP_SETTINGS_FIELDS",
    "DEFAULTS",
    "TRAIN_MESSAGE_KEYS",
    "AppKey",
    "Scalar",
    "check_run_config",
    "check_values",
    "default",
    "field_name",
    "keys_read_by",
    "market_noise",
    "markdown_table",
    "membership_of",
    "neighbours_of",
    "count_or_auto",
    "pyproject_table",
    "python_source",
    "read",
    "RunConfigSchema",
    "relaunch_of",
    "settings_from",
    "SettingsFields",
    "train_message_config",
    "typed",
]

SettingsType = TypeVar("SettingsType")
Reader = Literal["data", "server", "client", "both"]


@dataclass(frozen=True)
class AppKey:
    """One run-config key.

    Attributes
    ----------
    name : str
        The key as Flower writes it (``-`` separated).
    default : bool, int, float or str
        Its default; its type is the key's type (an int is accepted for a float key).
    meaning : str
        What it does, one line (the comment in ``pyproject.toml``).
    reader : {"data", "server", "client", "both"}
        Who reads it: the data config (both apps), the ServerApp, the ClientApp, or both apps.
    check : callable, optional
        ``value -> bool``: whether a well-typed value can work.
    expected : str
        What :attr:`check` asks for, for the error message.
    """

    name: str
    default: Scalar
    meaning: str
    reader: Reader
    check: Callable[[Any], bool] | None = None
    expected: str = ""

    @property
    def field(self) -> str:
        """The key as a Python name (``num-selected`` -> ``num_selected``)."""
        return field_name(self.name)


def field_name(key: str) -> str:
    """A run-config key as a Python name (``num-selected`` -> ``num_selected``): the one place names change."""
    return key.replace("-", "_")


@dataclass(frozen=True)
class SettingsFields:
    """One generated class of a boundary's settings: a frozen dataclass with a field per run-config key.

    Attributes
    ----------
    name : str
        The class name; the boundary's class subclasses it (``class ServerSettings(ServerFields)``) to add methods,
        or its own fields under ``@dataclass(frozen=True)``.
    keys : tuple of str
        Its run-config keys in order, each a field named by :func:`field_name`, typed and defaulted by the schema.
    meaning : str
        Whose settings these are (the class docstring).
    overrides : Mapping[str, Scalar]
        Other defaults for some keys (a profile, like the engine's sweeps'), each checked as the key's type.
    """

    name: str
    keys: tuple[str, ...]
    meaning: str
    overrides: Mapping[str, Scalar] = dataclasses.field(default_factory=dict)


def _default_of(cls: type, name: str) -> Scalar:
    """The default of dataclass ``cls``'s field ``name``: the one default of a key the plugin also takes."""
    (value,) = [item.default for item in dataclasses.fields(cls) if item.name == name]
    assert isinstance(value, (bool, int, float, str)), name
    return value


def _market_default(name: str) -> Scalar:
    """The default of :class:`~flmarket_flwr.market.MarketConfig` field ``name``."""
    return _default_of(MarketConfig, name)


def _dataset_ok(value: str) -> bool:
    try:
        canonical_dataset_name(value)
    except ValueError:
        return False
    return True


def _neighbours_ok(value: str) -> bool:
    return value in ("auto", "all", "sparse") or (value.isdigit() and int(value) >= 2)


def _count_or_auto_ok(value: str) -> bool:
    return value == "auto" or value.isdigit()


def _node_ids_ok(value: str) -> bool:
    try:
        parse_node_ids("", value)
    except ValueError:
        return False
    return True


def _device_ok(value: str) -> bool:
    return re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", value) is not None


def _model_ok(value: str) -> bool:
    from flmarket_flwr.app.models import MODEL_NAMES  # pylint: disable=import-outside-toplevel  # torch: only when checked

    return value.lower().replace("-", "_") in MODEL_NAMES


APP_KEYS: Final[tuple[AppKey, ...]] = (
    # Data: the global distribution d1..d7, then a Dirichlet(alpha) split over the clients.
    AppKey("dataset", "digits", "digits (bundled), digits_xl, fashion_mnist (Debian's), cifar10, cinic10, deap",
           "data", _dataset_ok, f"one of {list(DATASET_NAMES)}"),
    AppKey("data-root", "", 'local data folder; "" for digits, digits_xl and fashion_mnist', "data"),
    AppKey("distribution", "d4", "global label distribution d1 (balanced) ... d7", "data",
           _one_of(DISTRIBUTIONS), f"one of {list(DISTRIBUTIONS)}"),
    AppKey("schedule", DEFAULT_SCHEDULE, "pruning schedule of d1..d7: geometric, or linear (the paper's Table 2)",
           "data", _one_of(SCHEDULES), f"one of {list(SCHEDULES)}"),
    AppKey("alpha", 0.5, "Dirichlet concentration of the per-class split over the clients", "data", _positive, "> 0"),
    AppKey("test-per-class", 30, "server-side balanced test set (digits: 300 images)", "data", _at_least(1), ">= 1"),
    AppKey("seed", 0, "data split, initial model, sampling, simulated costs", "data", _at_least(0), ">= 0"),
    # Selection.
    AppKey("budget", 600.0, "the buyer's auction budget R for the run: total payments, every market together, "
           "never exceed it", "server", _positive, "> 0"),
    AppKey("num-selected", 0, "0: the auction budget decides; n > 0: at most n winners, within it", "server",
           _at_least(0), ">= 0 (0: the auction budget decides)"),
    AppKey("auction-budget-rule", _market_default("budget_rule"), "the auction's budget rule: half (the paper's "
           "Algorithm 1, pays at most R/2) or whole (the same walk at R, pays up to R)", "server",
           _one_of(BUDGET_RULES), f"one of {list(BUDGET_RULES)}"),
    AppKey("cost-low", _default_of(SimulatedCostBid, "low"),
           "simulated cost per sample, uniform in [cost-low, cost-high)", "client", _positive, "> 0"),
    AppKey("cost-high", _default_of(SimulatedCostBid, "high"), "upper end of the simulated cost per sample", "client",
           _positive, "> 0"),
    AppKey("bid-markup", _default_of(SimulatedCostBid, "markup"), "bid = cost x N_e x (1 + markup)", "client",
           _at_least(0), ">= 0"),
    AppKey("market-timeout", _market_default("timeout"), "base seconds per market message round", "server",
           _positive, "> 0"),
    AppKey("market-timeout-per-node", _market_default("timeout_per_node"),
           "seconds added to a market round's deadline per node it addresses",
           "server", lambda value: 0.0 <= value < math.inf, ">= 0 and finite"),
    AppKey("market-min-participation", _market_default("min_participation"),
           "least fraction of the invited nodes left as bidders, or the market fails",
           "server", lambda value: 0.0 < value <= 1.0, "in (0, 1]"),
    AppKey("wait-for-nodes-timeout", _market_default("wait_for_nodes_timeout"),
           "seconds to wait for the SuperNodes to connect", "server", _positive, "> 0"),
    AppKey("min-market-clients", _market_default("min_clients"), "fewest clients PASS runs with", "server",
           _at_least(3), ">= 3 (PASS with 2 reveals a client's counts)"),
    AppKey("neighbours", _market_default("neighbours"), 'PASS masking graph: "auto", "all", "sparse" (the secure '
           'profile), or a degree "k"', "server", _neighbours_ok, "'auto', 'all', 'sparse' or a degree k >= 2 (as a "
           "string)"),
    AppKey("pass-reruns", _market_default("pass_reruns"), "PASS sessions run again, each without the clients a "
           'failed one named: "auto" (2; the secure profile: pass-colluders) or "n"', "server", _count_or_auto_ok,
           "'auto' or an integer n >= 0 (as a string)"),
    AppKey("pass-colluders", _market_default("pass_colluders"), "the secure profile: colluding clients its "
           'sparse mode is sized for and announces (nodes refuse fewer than their own pass-colluders): "auto" (a '
           'fifth of the directory, the nodes\' default) or "n"', "server", _count_or_auto_ok,
           "'auto' or an integer n >= 0 (as a string)"),
    AppKey("market-security", _market_default("security"), "the buyer's profile: semi-honest, or malicious (the "
           "secure profile: a graph the clients draw, or the complete graph; noise; each node sets market-security in "
           "its node config)", "server",
           _one_of(("semi_honest", "malicious")), "semi-honest or malicious"),
    AppKey("audit-winners", _market_default("audit_winners"),
           "winners open their PASS counts commitment to the buyer before payment", "server"),
    AppKey("identity-directory", "", 'path of the directory of the nodes\' identity keys they pin (JSON; needed by '
           'market-security=malicious); "" for none',
           "server"),
    AppKey("buyer-key", "", "path of the buyer's Ed25519 key (PEM) that signs the award; nodes may pin its public "
           'half (node config market-buyer-key); "" for a fresh key per market (logged)', "server"),
    AppKey("roster-history", "", "path of the buyer's record of its markets' members (JSON): each market leaves out "
           'the few clients the nodes\' release ledgers would refuse it for; "" for none', "server"),
    AppKey("market-include", "", "nodes that must train, outside the auction, each paid market-include-payment "
           'charged against the auction budget before the auction runs: ids or tags ("12, 345, tag:partner"; a tag '
           'is node config market-tag); "" for none', "server", _node_ids_ok,
           "comma-separated node ids or tag:<label>, like '12, tag:partner'"),
    AppKey("market-include-payment", 0.0, "fixed payment of each market-include node", "server",
           lambda value: 0.0 <= value < math.inf, ">= 0 and finite"),
    AppKey("market-exclude", "", 'nodes the market never invites: ids or tags ("12, tag:rival"); "" for none',
           "server", _node_ids_ok, "comma-separated node ids or tag:<label>, like '12, tag:rival'"),
    AppKey("market-relaunch-every", 0, "run the market again every n rounds, in the same run, out of what is left of "
           "the auction budget (0: off; by default it buys only nodes that have not released yet, the secure profile "
           "invites every node again)", "server", _at_least(0), ">= 0 (0: off)"),
    AppKey("market-relaunch-churn", 0.0, "run the market again when more than this fraction of the nodes joined or "
           "left since the last one (0: off)", "server", lambda value: 0.0 <= value < math.inf,
           ">= 0 and finite (0: off)"),
    AppKey("market-relaunch-min-cohort", 0, "run the market again when fewer of its cohort are connected (0: off)",
           "server", _at_least(0), ">= 0 (0: off)"),
    AppKey("market-relaunch-share", 1.0, "the most one market's auction may spend, as a share of budget (1: the first "
           "market may spend all of it; 0.5 keeps half for re-launches)", "server", lambda value: 0.0 < value <= 1.0,
           "in (0, 1]"),
    AppKey("settle-on-delivery", False, "true: each winner is paid pro rata to the rounds it delivered", "server"),
    AppKey("pass-dp-epsilon", 0.0, "distributed DP on N_s: record-level epsilon per market, 0 = off (exact N_s)",
           "both", lambda value: 0.0 <= value < math.inf, ">= 0 and finite (0: off)"),
    AppKey("pass-dp-delta", 1e-6, "delta of pass-dp-epsilon", "both", lambda value: 0.0 < value < 1.0, "in (0, 1)"),
    AppKey("pass-dp-honest-fraction", 0.5, "share of the roster whose noise alone reaches pass-dp-epsilon", "both",
           lambda value: 0.0 < value <= 1.0, "in (0, 1]"),
    # Training: FedAvg over the winners.
    AppKey("model", "digits_cnn", "digits_cnn | resnet56 | deap_cnn | fmnist_cnn", "both", _model_ok,
           "a model name: digits_cnn, resnet56, deap_cnn or fmnist_cnn"),
    AppKey("num-server-rounds", 15, "FedAvg rounds", "server", _at_least(1), ">= 1"),
    AppKey("fraction-train", 1.0, "fraction of the winners trained each round", "server",
           lambda value: 0.0 < value <= 1.0, "in (0, 1]"),
    AppKey("fraction-evaluate", 0.0, "federated evaluation on the winners (0: server-side only)", "server",
           lambda value: 0.0 <= value <= 1.0, "in [0, 1]"),
    AppKey("local-epochs", 3, "local epochs per round", "server", _at_least(1), ">= 1"),
    AppKey("batch-size", 8, "local mini-batch size", "server", _at_least(1), ">= 1"),
    AppKey("learning-rate", 0.1, "local SGD learning rate", "server", _positive, "> 0"),
    AppKey("momentum", 0.5, "local SGD momentum", "server", lambda value: 0.0 <= value < 1.0, "in [0, 1)"),
    AppKey("round-timeout", 600.0, "seconds per FedAvg round", "server", _positive, "> 0"),
    AppKey("device", "auto", "auto | cpu | cuda | cuda:<i>", "both", _device_ok, "auto, cpu, cuda or cuda:<i>"),
    AppKey("torch-threads", 1, "torch intra-op threads per ClientApp (0: torch default)", "both", _at_least(0),
           ">= 0"),
    # Results.
    AppKey("results-dir", "results/runs", "<results-dir>/<run-name>/; relative: under the ServerApp user's home",
           "server"),
    AppKey("run-name", "", "empty: <timestamp>_run-<run-id>", "server"),
    AppKey("train-log-dir", "", "non-empty: each ClientApp logs its train messages there (audit)", "client"),
)  # fmt: skip
"""Every key of the app's run config, in the order of ``[tool.flwr.app.config]``."""


def market_noise(epsilon: float, delta: float, honest_fraction: float) -> SkellamNoise | None:
    """The market's noise setting from keys ``pass-dp-epsilon``, ``-delta`` and ``-honest-fraction`` (None: off)."""
    return SkellamNoise(epsilon, delta, honest_fraction) if epsilon > 0 else None


def membership_of(include: str, include_payment: float, exclude: str) -> tuple[dict[Member, float], tuple[Member, ...]]:
    """The market's include and exclude lists from keys ``market-include``, ``-include-payment``, ``-exclude``:
    ``({included node id or tag: its fixed payment}, excluded node ids and tags)``; a ``ValueError`` names the key
    of a bad list."""
    included = parse_node_ids("market-include", include)
    return dict.fromkeys(included, float(include_payment)), parse_node_ids("market-exclude", exclude)


def relaunch_of(every: int, churn: float, min_cohort: int, share: float = 1.0) -> RelaunchPolicy | None:
    """The re-launch policy from keys ``market-relaunch-every``, ``-churn``, ``-min-cohort`` and ``-share`` (None: all
    off and the whole budget to the first market)."""
    policy = RelaunchPolicy(every_rounds=every, churn_fraction=churn, min_cohort=min_cohort, market_share=share)
    return policy if policy.enabled or share < 1 else None


def neighbours_of(value: str) -> int | str:
    """The PASS graph setting of key ``neighbours`` as the market takes it: a degree as an int, else the word."""
    return int(value) if value.isdigit() else value


def count_or_auto(value: str) -> int | str:
    """A count setting (keys ``pass-reruns``, ``pass-colluders``) as the market takes it: an int, else ``"auto"``."""
    return int(value) if value.isdigit() else value


def _python(value: Scalar) -> str:
    """``value`` as a Python literal, double-quoted as ``ruff format`` writes strings."""
    return json.dumps(value) if isinstance(value, str) else repr(value)


def _docstring(text: str, indent: str) -> list[str]:
    """``text`` as a docstring's lines at ``indent``, wrapped within 120 characters."""
    quotes = '"' * 3
    lines = textwrap.wrap(text.replace(quotes, "'" * 3), 110 - len(indent), break_on_hyphens=False)
    lines[0] = quotes + lines[0]
    lines[-1] += (" " if lines[-1].endswith('"') else "") + quotes  # as ruff format writes a docstring ending in "
    return [indent + line for line in lines]


def _toml(value: Scalar) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(value)


class RunConfigSchema:
    """A run-config schema: its keys, and the one checker, reader and class maker of every run config.

    The app's is :data:`APP_SCHEMA` (the module's functions are its methods); an app built on this one (the
    experiments) declares its own keys of the same :class:`AppKey` type and calls :meth:`extended`.

    Parameters
    ----------
    keys : sequence of AppKey
        The keys, in the order the tables list them; each name once.
    command : str
        The command that prints the keys (named in the error for an unknown key).
    """

    def __init__(self, keys: Sequence[AppKey], command: str) -> None:
        self.keys: tuple[AppKey, ...] = tuple(keys)
        self.command = command
        self._by_name = {key.name: key for key in self.keys}
        if len(self._by_name) != len(self.keys):
            repeated = sorted({key.name for key in self.keys if [k.name for k in self.keys].count(key.name) > 1})
            raise ValueError(f"run-config key(s) {repeated} declared twice")
        self.defaults: dict[str, Scalar] = {key.name: key.default for key in self.keys}
        """Every key's default (``-`` style names)."""

    def extended(self, keys: Sequence[AppKey], command: str) -> RunConfigSchema:
        """This schema and ``keys`` (another app's own, none of them one of this schema's), listed by ``command``."""
        return RunConfigSchema((*self.keys, *keys), command)

    def key(self, name: str) -> AppKey:
        """The key named ``name``."""
        return self._by_name[name]

    def default(self, name: str) -> Scalar:
        """The default of run-config key ``name``."""
        return self._by_name[name].default

    def keys_read_by(self, *readers: Reader) -> tuple[str, ...]:
        """The names of the keys read by any of ``readers``."""
        return tuple(key.name for key in self.keys if key.reader in readers)

    def typed(self, name: str, value: Any) -> Scalar:
        """``value`` as key ``name``'s type (an int for a float key is fine), or a ``ValueError`` naming the key."""
        return typed_value("run", name, value, type(self.default(name)), self.default(name))

    def read(self, run_config: Mapping[str, Any], name: str) -> Any:
        """Key ``name`` of ``run_config``, typed, or its default when absent."""
        return self.typed(name, run_config[name]) if name in run_config else self.default(name)

    def python_source(self, classes: Sequence[SettingsFields], command: str) -> str:
        """The source of a module declaring ``classes``: what ``command`` writes, which a type checker can read.

        Each class is a frozen dataclass with a field per key, typed and defaulted by this schema (or its
        ``overrides``), each key's meaning as the field's docstring; it runs its ``check()`` when made (nothing,
        unless the boundary's subclass overrides it with its own rules). The fields are never written by hand: a
        key is named in its schema only, and a test holds the module equal to this text.

        Raises
        ------
        ValueError
            An override of the wrong type, naming the key.
        """
        lines = [
            f'"""Generated by ``{command}``: do not edit (a test holds the two equal).',
            "",
            "A frozen dataclass per boundary with a field per run-config key (``-`` there for ``_`` here), typed and",
            "defaulted by the schema, each key's meaning as its docstring; each boundary's settings subclass one.",
            '"""',
            "",
            "from __future__ import annotations",
            "",
            "from dataclasses import dataclass",
            "",
            "__all__ = [" + ", ".join(f'"{spec.name}"' for spec in classes) + "]",
        ]
        for spec in classes:
            lines += ["", "", "@dataclass(frozen=True)", f"class {spec.name}:", *_docstring(spec.meaning, "    "), ""]
            for name in spec.keys:
                value = self.typed(name, spec.overrides[name]) if name in spec.overrides else self.default(name)
                kind = type(self.default(name)).__name__
                lines += [
                    f"    {field_name(name)}: {kind} = {_python(value)}",
                    *_docstring(self.key(name).meaning, "    "),
                ]
            lines += [
                "",
                "    def __post_init__(self) -> None:",
                "        self.check()",
                "",
                "    def check(self) -> None:",
                '        """Raise ``ValueError`` for settings that cannot work together: a subclass\'s rules (the',
                '        schema checks each key\'s value)."""',
            ]
        return "\n".join(lines) + "\n"

    def settings_from(self, cls: type[SettingsType], run_config: Mapping[str, Any], **extra: Any) -> SettingsType:
        """An instance of a generated settings class (:meth:`python_source`) read from ``run_config``: each key
        typed, absent ones at default.

        Only typed (:meth:`read`), not checked: check the whole run config once where it enters
        (:meth:`check_run_config`). ``extra`` sets the class's own fields.

        Raises
        ------
        ValueError
            A value of the wrong type, naming the key.
        """
        keys = {key.field: key.name for key in self.keys}
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        values = {item.name: self.read(run_config, keys[item.name]) for item in fields if item.name in keys}
        return cls(**values, **extra)

    def check_values(self, values: Mapping[str, Any]) -> None:
        """Check each given key's value, and the rules that join two keys.

        Raises
        ------
        ValueError
            Naming the first key whose value cannot work and what it must be.
        """
        for name, value in values.items():
            key = self._by_name[name]
            check_value("run", name, value, key.check, key.expected)
        if "cost-low" in values and "cost-high" in values and not values["cost-low"] < values["cost-high"]:
            raise ValueError(
                "run-config keys cost-low/cost-high: must be cost-low < cost-high; fix it with --run-config"
            )

    def check_run_config(self, run_config: Mapping[str, Any], ignore: Iterable[str] = ()) -> dict[str, Any]:
        """The whole run config, checked and typed, with every absent key at its default.

        Parameters
        ----------
        run_config : Mapping[str, Any]
            Flower's ``context.run_config`` (or a Hydra job's, mapped).
        ignore : iterable of str
            Keys other code owns (they are passed through unchecked).

        Raises
        ------
        ValueError
            For an unknown key, a value of the wrong type, or a value its check refuses, naming the key.
        """
        skipped = set(ignore)
        unknown = sorted(set(run_config) - set(self._by_name) - skipped)
        if unknown:
            close = {key: difflib.get_close_matches(key, self._by_name, n=1) for key in unknown}
            hints = "".join(f"; {key!r}: did you mean {found[0]!r}?" for key, found in close.items() if found)
            raise ValueError(f"unknown run-config key(s) {unknown}{hints}; {self.command} lists every key")
        values = {key.name: self.read(run_config, key.name) for key in self.keys}
        self.check_values(values)
        return values | {name: run_config[name] for name in skipped if name in run_config}

    def pyproject_table(self) -> str:
        """``[tool.flwr.app.config]`` as ``pyproject.toml`` holds it (a key per line, its meaning as the comment)."""
        lines = ["[tool.flwr.app.config]"]
        lines += [f"{key.name} = {_toml(key.default)}  # {key.meaning}" for key in self.keys]
        return "\n".join(lines) + "\n"

    def markdown_table(self) -> str:
        """Every key as a Markdown table (key, default, who reads it, meaning, what a value must be): the app's is
        the run-config half of ``docs/configuration.md``, which a test holds equal to it."""
        lines = ["| key | default | read by | meaning | a value must be |", "| --- | --- | --- | --- | --- |"]
        for key in self.keys:
            meaning = key.meaning.replace("|", "\\|")
            expected = key.expected or "any"
            lines.append(f"| `{key.name}` | `{_toml(key.default)}` | {key.reader} | {meaning} | {expected} |")
        return "\n".join(lines) + "\n"


APP_SCHEMA: Final = RunConfigSchema(APP_KEYS, "python -m flmarket_flwr.app.run_config")
"""The app's run-config schema: :data:`APP_KEYS`, and the functions below are its methods."""

DEFAULTS: Final[dict[str, Scalar]] = APP_SCHEMA.defaults
"""Every key's default (``-`` style names)."""

default = APP_SCHEMA.default
keys_read_by = APP_SCHEMA.keys_read_by
typed = APP_SCHEMA.typed
read = APP_SCHEMA.read
settings_from = APP_SCHEMA.settings_from
check_values = APP_SCHEMA.check_values
check_run_config = APP_SCHEMA.check_run_config
pyproject_table = APP_SCHEMA.pyproject_table
markdown_table = APP_SCHEMA.markdown_table


TRAIN_MESSAGE_KEYS: Final = ("local-epochs", "batch-size", "learning-rate", "momentum")
"""The keys the ServerApp sends in each train message's ``config`` record (the ClientApp reads them from there)."""


def train_message_config(settings: object) -> dict[str, Any]:
    """The train message's ``config`` record: the :data:`TRAIN_MESSAGE_KEYS` fields of ``settings`` (an instance of
    a generated settings class that has them)."""
    return {name: getattr(settings, field_name(name)) for name in TRAIN_MESSAGE_KEYS}


APP_SETTINGS_FIELDS: Final = (
    SettingsFields(
        "ServerFields",
        keys_read_by("data", "server", "both"),
        "The run config as the ServerApp reads it: the keys read by the data config, the server or both apps.",
    ),
    SettingsFields(
        "ClientFields",
        keys_read_by("data", "client", "both"),
        "The run config as the ClientApp reads it: the keys read by the data config, the client or both apps.",
    ),
    SettingsFields("TrainFields", TRAIN_MESSAGE_KEYS, "A train message's local-training settings."),
    SettingsFields("DataFields", keys_read_by("data"), "The data config's run-config keys."),
)
"""The app's generated settings classes, in :mod:`flmarket_flwr.app.settings_fields`."""


def python_source() -> str:
    """The source of :mod:`flmarket_flwr.app.settings_fields` (``python -m flmarket_flwr.app.run_config --python``)."""
    return APP_SCHEMA.python_source(APP_SETTINGS_FIELDS, "python -m flmarket_flwr.app.run_config --python")


if __name__ == "__main__":
    import sys

    printers: dict[tuple[str, ...], Callable[[], str]] = {("--markdown",): markdown_table, ("--python",): python_source}
    print(printers.get(tuple(sys.argv[1:]), pyproject_table)(), end="")
