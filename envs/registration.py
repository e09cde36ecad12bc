"""The env's Gymnasium registration: plain ``gymnasium.register`` calls, made once by importing ``admit.envs``.

``admit/TenantAdmission-v1`` is generic: it takes ``scenario=`` and truncates at that scenario's horizon
by itself, so it has no ``max_episode_steps`` (a fixed one would cut a longer scenario short). Every
bundled scenario also gets ``admit/TenantAdmission-<scenario>-v1``, the scenario bound and its step count
as ``max_episode_steps``, for tools that read ``env.spec.max_episode_steps``; its ``TimeLimit`` truncates
at the very step the env does. The ``-v0`` ids are the same envs with the first observation layout
(``layout=1``), what the first policies were trained on. The class docstring of
``admit.envs.env.TenantAdmissionEnv`` says the same.
"""

from __future__ import annotations

import gymnasium

ENV_ID = "admit/TenantAdmission-v1"
ENV_ID_V0 = "admit/TenantAdmission-v0"
ENTRY_POINT = "admit.envs.env:TenantAdmissionEnv"
LAYOUT_OF_VERSION = {0: 1, 1: 2}  # env version -> observation layout (core/observation.py)


def scenario_env_id(scenario: str, version: int = 1) -> str:
    """The id of the env bound to one bundled scenario, e.g. ``admit/TenantAdmission-seed-paper-v1``."""
    return f"admit/TenantAdmission-{scenario}-v{version}"


def register() -> None:
    from admit.envs.scenario import bundled_scenarios, load_scenario
    from admit.envs.simulation import decision_count

    for version, layout in LAYOUT_OF_VERSION.items():
        gymnasium.register(id=f"admit/TenantAdmission-v{version}", entry_point=ENTRY_POINT,
                           kwargs={"layout": layout})
        for name in bundled_scenarios():
            gymnasium.register(id=scenario_env_id(name, version), entry_point=ENTRY_POINT,
                               kwargs={"scenario": name, "layout": layout},
                               max_episode_steps=decision_count(load_scenario(name)))
