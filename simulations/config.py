"""From a Hydra experiment config to the job's run config: the Flower app's keys and the experiments' own.

One source of truth
-------------------
A job's keys, types, defaults and checks are :data:`simulations.run_config.EXPERIMENT_SCHEMA`: the Flower app's
(:data:`flmarket_flwr.app.run_config.APP_KEYS`) and the experiments' own (``selector``, ``val-per-class``).
Hydra reads them as a structured config (``app_schema``, registered here on import, first in
``conf/config.yaml``'s defaults list): a top-level key's default and type come from the schema, so an
override of the wrong type fails at composition. The group options (``dataset``, ``model``, ...)
choose among sweep settings; :func:`to_run_config` maps a composed Hydra config back to the job's keys and
checks it with the schema, and ``tests/test_experiment_config.py`` checks that the default
composition maps to exactly the schema's defaults.

Key mapping: the Hydra keys of the group nodes are listed in :data:`GROUP_KEYS`; every
other top-level scalar key is the run-config key with ``_`` for ``-`` (``num_selected`` ->
``num-selected``). The ``sim`` node (how :mod:`simulations.run` runs the job: Ray,
resources, logging), the ``federation`` node (how many SuperNodes) and Hydra's own ``hydra`` node are
not app config.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import field, make_dataclass
from functools import partial
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from simulations.run_config import EXPERIMENT_SCHEMA

__all__ = [
    "CONF_DIR",
    "GROUP_DEFAULTS",
    "GROUP_KEYS",
    "NON_APP_KEYS",
    "PROJECT_ROOT",
    "SCHEMA_NAME",
    "app_config_defaults",
    "to_run_config",
]

PROJECT_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = PROJECT_ROOT / "conf"

GROUP_KEYS: dict[str, str] = {
    "dataset.name": "dataset",
    "dataset.root": "data-root",
    "dataset.test_per_class": "test-per-class",
    "dataset.val_per_class": "val-per-class",
    "model.name": "model",
    "distribution.name": "distribution",
    "selector.name": "selector",
}
"""Hydra key (dotted path in a group node) -> run-config key of the job (:data:`EXPERIMENT_SCHEMA`)."""

GROUP_DEFAULTS = ("dataset.val_per_class",)
"""Group keys no option of their group sets: their node starts at the schema's default (``selector=sfedavg`` and the
command line change it). Every other group key is its option's (``dataset.root: ???`` stays mandatory)."""

NON_APP_KEYS = frozenset({"sim", "hydra", "federation"})
"""Top-level Hydra nodes that are not app config (``federation.num_clients`` is the number of SuperNodes
:mod:`simulations.run` starts: like ``flwr run``, the app learns it from the federation)."""


SCHEMA_NAME = "app_schema"
"""The structured config of the job's top-level keys, in Hydra's ConfigStore (see :func:`register_app_schema`)."""


def register_app_schema() -> None:
    """Store the job's schema as Hydra's structured config :data:`SCHEMA_NAME` (idempotent).

    Its fields are the keys Hydra sets at the top level (``_`` for ``-``), with the schema's types
    and defaults, and one untyped field per group node and runner node, its :data:`GROUP_DEFAULTS` at the
    schema's defaults.
    """
    grouped = set(GROUP_KEYS.values())
    app_fields = [
        (key.field, type(key.default), field(default=key.default))
        for key in EXPERIMENT_SCHEMA.keys
        if key.name not in grouped
    ]
    nodes: dict[str, dict[str, Any]] = {node: {} for node in sorted(NON_APP_KEYS - {"hydra"})}
    for path, key in GROUP_KEYS.items():
        node, name = path.split(".")
        nodes.setdefault(node, {})
        if path in GROUP_DEFAULTS:
            nodes[node][name] = EXPERIMENT_SCHEMA.default(key)
    node_fields: list[tuple[str, Any, Any]] = [
        (node, Any, field(default_factory=partial(dict, values)) if values else field(default=None))
        for node, values in sorted(nodes.items())
    ]
    schema = make_dataclass("AppConfig", [*app_fields, *node_fields])
    ConfigStore.instance().store(name=SCHEMA_NAME, node=schema)


register_app_schema()


def app_config_defaults(pyproject: Path | None = None) -> dict[str, Any]:
    """The app's ``[tool.flwr.app.config]`` from ``pyproject.toml``."""
    path = pyproject or PROJECT_ROOT / "pyproject.toml"
    with path.open("rb") as file:
        return dict(tomllib.load(file)["tool"]["flwr"]["app"]["config"])


def _scalar(value: Any, key: str, default: Any = None) -> bool | int | float | str:
    """Check a config value, converted to the type of the app default when that is lossless.

    ``budget=700`` on Hydra's command line is an int; the app's default ``600.0`` is a
    float, so the run config gets ``700.0``. ``run_name=7`` becomes ``"7"``.
    """
    if not isinstance(value, (bool, int, float, str)):
        raise TypeError(f"config key {key!r} must be a bool, int, float or str, got {value!r}")
    if default is None or isinstance(value, bool) or isinstance(default, bool):
        return value
    if isinstance(default, float) and isinstance(value, int):
        return float(value)
    if isinstance(default, int) and isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(default, str) and isinstance(value, (int, float)):
        return str(value)
    return value


def to_run_config(cfg: DictConfig | Mapping[str, Any]) -> dict[str, bool | int | float | str]:
    """Map a composed Hydra config to the job's run config (:func:`simulations.run_config.split_run_config` gives
    the Flower app its own keys).

    Parameters
    ----------
    cfg : DictConfig or Mapping
        The job's config (as given to the Hydra task function).

    Returns
    -------
    dict
        Run-config keys (``-`` style) and values: exactly the keys of :data:`EXPERIMENT_SCHEMA`, checked.

    Raises
    ------
    KeyError
        If the config lacks a run-config key or has a top-level key the schema does not know.
    """
    container = (
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True) if isinstance(cfg, DictConfig) else dict(cfg)
    )
    assert isinstance(container, dict)
    known = EXPERIMENT_SCHEMA.defaults
    run_config: dict[str, bool | int | float | str] = {}
    for path, app_key in GROUP_KEYS.items():
        node: Any = container
        for part in path.split("."):
            if not isinstance(node, Mapping) or part not in node:
                raise KeyError(f"the experiment config has no {path!r} (run-config key {app_key!r})")
            node = node[part]
        run_config[app_key] = _scalar(node, path, known.get(app_key))
    groups = {path.split(".")[0] for path in GROUP_KEYS}
    for key, value in container.items():
        if key in groups or key in NON_APP_KEYS:
            continue
        app_key = str(key).replace("_", "-")
        if app_key not in known:
            raise KeyError(
                f"top-level config key {key!r} is not a run-config key ({app_key!r}: "
                f"{EXPERIMENT_SCHEMA.command} and python -m flmarket_flwr.app.run_config list them); "
                "put runner settings under 'sim'"
            )
        run_config[app_key] = _scalar(value, str(key), known[app_key])
    missing = sorted(set(known) - set(run_config))
    if missing:
        raise KeyError(f"the experiment config does not set run-config key(s) {missing}")
    EXPERIMENT_SCHEMA.check_run_config(run_config)
    return run_config
