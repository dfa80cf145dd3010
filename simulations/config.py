"""From a Hydra experiment config to the Flower app's run config.

One source of truth
-------------------
The Flower app's keys, types, defaults and checks are :data:`flmarket_flwr.app.run_config.APP_KEYS`.
Hydra reads them as a structured config (``app_schema``, registered here on import, first in
``conf/config.yaml``'s defaults list): a top-level key's default and type come from the schema, so an
override of the wrong type fails at composition. The group options (``dataset``, ``model``, ...)
choose among sweep settings; :func:`to_run_config` maps a composed Hydra config back to app keys and
checks it with the schema, and ``tests/test_experiment_config.py`` checks that the default
composition maps to exactly the schema's defaults.

Key mapping: the Hydra keys of the group nodes are listed in :data:`GROUP_KEYS`; every
other top-level scalar key is the app key with ``_`` for ``-`` (``num_selected`` ->
``num-selected``). The ``sim`` node (how :mod:`simulations.run` runs the job: Ray,
resources, logging), the ``federation`` node (how many SuperNodes) and Hydra's own ``hydra`` node are
not app config.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import field, make_dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from flmarket_flwr.app.run_config import APP_KEYS, DEFAULTS, check_run_config

__all__ = [
    "CONF_DIR",
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
"""Hydra key (dotted path in a group node) -> Flower app-config key."""

NON_APP_KEYS = frozenset({"sim", "hydra", "federation"})
"""Top-level Hydra nodes that are not app config (``federation.num_clients`` is the number of SuperNodes
:mod:`simulations.run` starts: like ``flwr run``, the app learns it from the federation)."""


SCHEMA_NAME = "app_schema"
"""The structured config of the app's top-level keys, in Hydra's ConfigStore (see :func:`register_app_schema`)."""


def register_app_schema() -> None:
    """Store the app's schema as Hydra's structured config :data:`SCHEMA_NAME` (idempotent).

    Its fields are the app keys Hydra sets at the top level (``_`` for ``-``), with the schema's types
    and defaults, and one untyped field per group node and runner node.
    """
    grouped = set(GROUP_KEYS.values())
    app_fields = [
        (key.field, type(key.default), field(default=key.default)) for key in APP_KEYS if key.name not in grouped
    ]
    nodes = sorted({path.split(".")[0] for path in GROUP_KEYS} | (NON_APP_KEYS - {"hydra"}))
    schema = make_dataclass("AppConfig", [*app_fields, *[(node, Any, field(default=None)) for node in nodes]])
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
    """Map a composed Hydra config to the Flower app's run config.

    Parameters
    ----------
    cfg : DictConfig or Mapping
        The job's config (as given to the Hydra task function).

    Returns
    -------
    dict
        App-config keys (``-`` style) and values, exactly the keys of
        ``[tool.flwr.app.config]``.

    Raises
    ------
    KeyError
        If the config lacks an app key or has a top-level key the app does not know.
    """
    container = (
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True) if isinstance(cfg, DictConfig) else dict(cfg)
    )
    assert isinstance(container, dict)
    known = DEFAULTS
    run_config: dict[str, bool | int | float | str] = {}
    for path, app_key in GROUP_KEYS.items():
        node: Any = container
        for part in path.split("."):
            if not isinstance(node, Mapping) or part not in node:
                raise KeyError(f"the experiment config has no {path!r} (app key {app_key!r})")
            node = node[part]
        run_config[app_key] = _scalar(node, path, known.get(app_key))
    groups = {path.split(".")[0] for path in GROUP_KEYS}
    for key, value in container.items():
        if key in groups or key in NON_APP_KEYS:
            continue
        app_key = str(key).replace("_", "-")
        if app_key not in known:
            raise KeyError(
                f"top-level config key {key!r} is not a Flower app key ({app_key!r} is not in "
                f"[tool.flwr.app.config]); put runner settings under 'sim'"
            )
        run_config[app_key] = _scalar(value, str(key), known[app_key])
    missing = sorted(set(known) - set(run_config))
    if missing:
        raise KeyError(f"the experiment config does not set app key(s) {missing}")
    check_run_config(run_config)
    return run_config
