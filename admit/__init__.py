"""admit: learned admission control for multi-tenant LLM serving.

Importing ``admit`` does two small things at import time, both without importing anything heavy:

* **The env's registration.** ``admit/TenantAdmission-v1`` is registered with Gymnasium as soon as
  Gymnasium is imported — at once if it already is, else by a one-shot hook that runs right after
  ``import gymnasium`` — so ``import admit, gymnasium; gymnasium.make("admit/TenantAdmission-v1")`` works
  while a process that never uses Gymnasium (the gateway, the emulator, the load generator) never pays
  for importing it.
* **Moved modules.** Modules that moved to another folder (``MOVED``) still import under their old
  names, with a DeprecationWarning naming the new one; the old name is the very module object of the
  new, so pickles that name the old path (a saved policy) load too.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

__version__ = "0.1.0"

ENV_ID = "admit/TenantAdmission-v1"

# old module -> new module (issue 11: live/, engine/, evaluate/, gateway/redis/ got folders of their own)
MOVED = {
    "admit.gateway.control": "admit.live.control",
    "admit.gateway.control_cli": "admit.live.cli",
    "admit.gateway.live_run": "admit.live.run",
    "admit.gateway.stack": "admit.live.stack",
    "admit.gateway.demo": "admit.live.demo",
    "admit.gateway.sim2live": "admit.live.sim2live",
    "admit.gateway.redis_admission": "admit.gateway.redis.admission",
    "admit.gateway.redis_envelopes": "admit.gateway.redis.envelopes",
    "admit.gateway.redis_metrics": "admit.gateway.redis.metrics",
    "admit.gateway.redis_scripts": "admit.gateway.redis.scripts",
    "admit.envs.engine": "admit.engine.base",
    "admit.envs.slot_engine": "admit.engine.slot_engine",
    "admit.envs.token_engine": "admit.engine.token_engine",
    "admit.envs.steptime": "admit.engine.steptime",
    "admit.envs.presets": "admit.engine.presets",
    "admit.envs.request": "admit.engine.request",
    "admit.envs.calibration": "admit.engine.calibration",
    "admit.envs.fidelity": "admit.engine.fidelity",
    "admit.train.evaluate": "admit.evaluate.offline",
    "admit.train.results": "admit.evaluate.results",
    "admit.train.report": "admit.evaluate.report",
    "admit.core.windows": "admit.core.percentiles",  # its live function, p50_p95_p99, moved; the rest was dead
}


def register_env() -> None:
    """Register the env with Gymnasium (idempotent); importing Gymnasium after admit calls it by itself."""
    import gymnasium

    if ENV_ID not in gymnasium.registry:
        from admit.envs.registration import register

        register()


class _Alias(importlib.abc.Loader):
    """Loads an old module name as the module object of its new name."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(f"{spec.name} moved to {self.new}; import it from there", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self._spec  # importlib set the alias's spec on it; the module keeps its own


class _AfterGymnasium(importlib.abc.Loader):
    """Runs Gymnasium's own loader, then registers the env."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.loader.exec_module(module)
        register_env()

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, get_data, is_package ...: the real loader's
        return getattr(self.loader, name)


Spec = importlib.machinery.ModuleSpec


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: ModuleType | None = None) -> Spec | None:
        new = MOVED.get(name)
        if new is not None:
            return importlib.util.spec_from_loader(name, _Alias(new))
        if name == "gymnasium" and "gymnasium" not in sys.modules:
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is not None and spec.loader is not None:
                spec.loader = _AfterGymnasium(spec.loader)
            return spec
        return None


if not any(isinstance(f, _Finder) for f in sys.meta_path):
    sys.meta_path.insert(0, _Finder())  # first: it must see "gymnasium" before the path finder does
if "gymnasium" in sys.modules:
    register_env()
