"""The env's Gymnasium registration (admit/__init__.py calls `register` once Gymnasium is imported).

``admit/TenantAdmission-v0`` is generic: it takes ``scenario=`` and truncates at that scenario's horizon
by itself, so it has no ``max_episode_steps`` (a fixed one would cut a longer scenario short). Every
bundled scenario also gets ``admit/TenantAdmission-<scenario>-v0``, the scenario bound and its step count
as ``max_episode_steps``, for tools that read ``env.spec.max_episode_steps``; its ``TimeLimit`` truncates
at the very step the env does. The class docstring of ``admit.envs.env.TenantAdmissionEnv`` says the same.
"""

from __future__ import annotations

import gymnasium

ENV_ID = "admit/TenantAdmission-v0"
ENTRY_POINT = "admit.envs.env:TenantAdmissionEnv"


def scenario_env_id(scenario: str) -> str:
    """The id of the env bound to one bundled scenario, e.g. ``admit/TenantAdmission-seed-paper-v0``."""
    return f"admit/TenantAdmission-{scenario}-v0"


def register() -> None:
    from admit.envs.scenario import bundled_scenarios, load_scenario
    from admit.envs.simulation import decision_count

    gymnasium.register(id=ENV_ID, entry_point=ENTRY_POINT)
    for name in bundled_scenarios():
        gymnasium.register(id=scenario_env_id(name), entry_point=ENTRY_POINT, kwargs={"scenario": name},
                           max_episode_steps=decision_count(load_scenario(name)))
