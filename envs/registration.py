"""The env's Gymnasium registration (admit/__init__.py calls `register` once Gymnasium is imported)."""

from __future__ import annotations

import gymnasium

ENV_ID = "admit/TenantAdmission-v0"


def register() -> None:
    gymnasium.register(id=ENV_ID, entry_point="admit.envs.env:TenantAdmissionEnv")
