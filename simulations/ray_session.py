"""Keep Ray, and Flower's Ray actors, alive between ``run_simulation`` calls of one process.

Why
---
A sweep runs hundreds of short Flower simulations one after the other in one process
(Hydra's basic launcher runs every job in the process that started the sweep). With
``flwr.simulation.run_simulation`` as it is in Flower 1.41, every job pays for a whole
Ray life cycle, measured on the 2-core development machine:

==========================================================  ===========
step                                                        time
==========================================================  ===========
``ray.init`` (GCS, raylet, object store, prestarted workers)  6.4-8.3 s
two ``ClientAppActor`` processes (import flwr, then torch)    3.3-6.1 s
``ray.shutdown``                                              1.1-1.6 s
==========================================================  ===========

that is 11 to 16 s of overhead per job, more than the training of a digits job.

What Flower does (read in ``flwr/server/superlink/fleet/vce/``)
----------------------------------------------------------------
* ``RayBackend.init_ray`` calls ``ray.init`` only ``if not ray.is_initialized()``: a
  Ray instance started beforehand *is* reused.
* But ``RayBackend.terminate`` (called at the end of every run by
  ``vce_api.run_api``) always calls ``BasicActorPool.terminate_all_actors()`` and then
  ``ray.shutdown()``. So with the public API, Ray cannot stay up between two runs, and
  the actors (one process each) never survive a run.
* ``vce_api.start_vce`` always builds a ``RayBackend`` (the ``backend_name`` argument is
  not consulted in 1.41): there is no other backend to plug in.

What this module does
---------------------
:class:`WarmRay` starts Ray once (same ``runtime_env`` as Flower's backend, the
dashboard off) and, only while :meth:`WarmRay.active` is entered, replaces two names
inside ``flwr.server.superlink.fleet.vce.backend.raybackend``:

* ``ray`` by a proxy whose ``shutdown`` does nothing (everything else is Ray's own), and
* ``BasicActorPool`` by :class:`ReusableActorPool`, which takes its actors from the
  session's cache when it is built and gives the idle ones back to the cache instead of
  terminating them (actors still busy at the end of a run, e.g. after a timeout, are
  killed).

Everything else -- ``run_simulation``, the in-memory SuperLink state, the ServerApp
thread, the message workers, the ``ClientAppActor`` class, the way messages and
contexts travel to the actors -- is Flower's own and unchanged; every job is still one
``run_simulation`` call. The cached actors are plain ``ClientAppActor`` instances: they
keep no Flower state between messages (each message brings its ``Context``), only the
process-level caches of :mod:`flmarket_flwr.task` (data set, partitions, keyed by the
data config), which is the point. :meth:`WarmRay.shutdown` (also registered with
``atexit``) kills the cached actors and shuts Ray down.

Measured effect: see ``simulations/README.md``. If Flower's internals change (the two
names are missing), :meth:`WarmRay.active` raises ``RuntimeError``; run with
``sim.warm_ray=false`` to use the plain per-job Ray life cycle.
"""

from __future__ import annotations

import atexit
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from logging import DEBUG, INFO, WARNING
from types import ModuleType
from typing import Any

from flwr.supercore import log

__all__ = ["ReusableActorPool", "WarmRay", "warm_ray_session"]

_BACKEND_MODULE = "flwr.server.superlink.fleet.vce.backend.raybackend"


def _resource_key(resources: dict[str, Any]) -> tuple[tuple[str, float], ...]:
    """A hashable key of an actor's resource request."""
    return tuple(sorted((str(k), float(v)) for k, v in resources.items()))


class _RayWithoutShutdown:
    """A stand-in for the ``ray`` module whose ``shutdown`` is a no-op."""

    def __init__(self, real: ModuleType) -> None:
        self._real = real

    def shutdown(self, *args: Any, **kwargs: Any) -> None:  # pylint: disable=unused-argument
        """Keep Ray running: :class:`WarmRay` shuts it down at the end of the sweep."""
        log(DEBUG, "WarmRay: ignoring ray.shutdown() from Flower's RayBackend")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


class WarmRay:
    """One Ray instance and one cache of Flower ``ClientAppActor`` s for many runs.

    Parameters
    ----------
    init_args : dict, optional
        Keyword arguments of ``ray.init`` (e.g. ``num_cpus``, ``logging_level``,
        ``log_to_driver``); ``include_dashboard`` defaults to ``False``.
    """

    def __init__(self, init_args: dict[str, Any] | None = None) -> None:
        self.init_args = dict(init_args or {})
        self._cache: dict[tuple[tuple[str, float], ...], list[Any]] = {}
        self._started_here = False
        self.stats = {"ray_init_s": 0.0, "actors_created": 0, "actors_reused": 0}
        atexit.register(self.shutdown)

    # --- Ray -----------------------------------------------------------------------------------
    def start(self) -> None:
        """Start Ray with Flower's runtime environment, unless it is already running."""
        import ray  # pylint: disable=import-outside-toplevel

        if ray.is_initialized():
            return
        # As RayBackend.init_ray does: Ray workers inherit the environment, not sys.path.
        pythonpath = os.pathsep.join(sys.path)
        if os.environ.get("PYTHONPATH"):
            pythonpath = f"{pythonpath}{os.pathsep}{os.environ['PYTHONPATH']}"
        os.environ["PYTHONPATH"] = pythonpath
        args = {"include_dashboard": False, **self.init_args}
        started = time.perf_counter()
        ray.init(runtime_env={"env_vars": {"PYTHONPATH": pythonpath}}, **args)
        self.stats["ray_init_s"] += time.perf_counter() - started
        self._started_here = True
        log(INFO, "WarmRay: Ray started in %.1fs; it stays up between runs", self.stats["ray_init_s"])

    def shutdown(self) -> None:
        """Kill the cached actors and shut Ray down (if this session started it)."""
        import ray  # pylint: disable=import-outside-toplevel

        for actors in self._cache.values():
            for actor in actors:
                _kill(actor)
        self._cache.clear()
        if self._started_here and ray.is_initialized():
            ray.shutdown()
        self._started_here = False

    def reset(self) -> None:
        """Forget every cached actor and restart Ray (after a failed run)."""
        self.shutdown()

    # --- Actor cache ---------------------------------------------------------------------------
    def take_actors(self, resources: dict[str, Any], count: int) -> list[Any]:
        """Return up to ``count`` live cached actors with exactly these resources.

        Cached actors with *other* resources are killed first: they hold CPUs (or GPU
        shares) that the new run's actors would otherwise wait for forever.
        """
        import ray  # pylint: disable=import-outside-toplevel

        key = _resource_key(resources)
        for other in [k for k in self._cache if k != key]:
            for actor in self._cache.pop(other):
                _kill(actor)
        cached = self._cache.pop(key, [])
        taken, rest = cached[:count], cached[count:]
        for actor in rest:
            _kill(actor)
        alive = []
        for actor in taken:
            try:
                ray.get(actor.__ray_ready__.remote(), timeout=30)
            except Exception:  # pylint: disable=broad-exception-caught
                log(WARNING, "WarmRay: a cached actor is gone; a new one replaces it")
                _kill(actor)
                continue
            alive.append(actor)
        self.stats["actors_reused"] += len(alive)
        return alive

    def give_back(self, resources: dict[str, Any], actors: list[Any]) -> None:
        """Keep idle actors for the next run."""
        self._cache.setdefault(_resource_key(resources), []).extend(actors)

    # --- Patching Flower's Ray backend ---------------------------------------------------------
    @contextmanager
    def active(self) -> Iterator[None]:
        """Within this block, Flower's ``RayBackend`` reuses this Ray and these actors."""
        import importlib  # pylint: disable=import-outside-toplevel

        import ray  # pylint: disable=import-outside-toplevel

        backend = importlib.import_module(_BACKEND_MODULE)
        if not hasattr(backend, "ray") or not hasattr(backend, "BasicActorPool"):
            raise RuntimeError(
                f"{_BACKEND_MODULE} has no 'ray' or 'BasicActorPool' (another Flower "
                "version?): run with sim.warm_ray=false"
            )
        self.start()
        session = self

        class _BoundPool(ReusableActorPool):
            warm_ray = session

        saved = (backend.ray, backend.BasicActorPool)
        backend.ray = _RayWithoutShutdown(ray)
        backend.BasicActorPool = _BoundPool
        try:
            yield
        finally:
            backend.ray, backend.BasicActorPool = saved


def _kill(actor: Any) -> None:
    import ray  # pylint: disable=import-outside-toplevel

    try:
        ray.kill(actor)
    except Exception:  # pylint: disable=broad-exception-caught
        pass


def _base_pool() -> type:
    from flwr.simulation.ray_transport.ray_actor import (  # pylint: disable=import-outside-toplevel
        BasicActorPool,
    )

    return BasicActorPool


class ReusableActorPool(_base_pool()):  # type: ignore[misc]
    """Flower's ``BasicActorPool``, with actors taken from and given back to a :class:`WarmRay`.

    Only the pool's life cycle changes: :meth:`add_actors_to_pool` first takes live
    cached actors, and :meth:`terminate_all_actors` returns the idle ones to the cache.
    Submitting messages and fetching results are Flower's own methods.
    """

    warm_ray: WarmRay | None = None

    def add_actors_to_pool(self, num_actors: int) -> None:
        """Add ``num_actors`` actors: cached ones first, new ones for the rest."""
        reused = self.warm_ray.take_actors(self.client_resources, num_actors) if self.warm_ray else []
        self.pool.extend(reused)
        for _ in range(num_actors - len(reused)):
            self.pool.append(self.create_actor_fn())
        if self.warm_ray is not None:
            self.warm_ray.stats["actors_created"] += num_actors - len(reused)
        self.num_actors += num_actors
        log(DEBUG, "ReusableActorPool: %d actors reused, %d created", len(reused), num_actors - len(reused))

    def terminate_all_actors(self) -> None:
        """Give the idle actors back to the cache; kill those still busy."""
        idle = list(self.pool)
        self.pool.clear()
        busy = list(self._future_to_actor.values())
        self._future_to_actor.clear()
        for actor in busy:
            _kill(actor)
        if self.warm_ray is not None:
            self.warm_ray.give_back(self.client_resources, idle)
        else:
            for actor in idle:
                _kill(actor)


_SESSION: WarmRay | None = None


def warm_ray_session(init_args: dict[str, Any] | None = None) -> WarmRay:
    """The process-wide :class:`WarmRay` (created on first use with ``init_args``)."""
    global _SESSION  # pylint: disable=global-statement
    if _SESSION is None:
        _SESSION = WarmRay(init_args)
    return _SESSION
