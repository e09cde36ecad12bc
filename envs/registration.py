"""The env's Gymnasium registration: plain ``gymnasium.register`` calls, made once by importing ``admit.envs``.

``admit/TenantAdmission-v1`` is generic: it takes ``scenario=`` and truncates at that scenario's horizon
by itself, so it has no ``max_episode_steps`` (a fixed one would cut a longer scenario short). Every
bundled scenario also gets ``admit/TenantAdmission-<scenario>-v1``, the scenario bound and its step count
as ``max_episode_steps``, for tools that read ``env.spec.max_episode_steps``; its ``TimeLimit`` truncates
at the very step the env does. The ``-v0`` ids are the same envs with the first observation layout
(``layout=1``), what the first policies were trained on. The ``-v1`` ids also have a ``vector_entry_point``:
``gymnasium.make_vec(id, num_envs=N, vectorization_mode="vector_entry_point")`` steps N worlds in one
compiled call (envs/vector.py). The class docstring of
``admit.envs.env.TenantAdmissionEnv`` says the same.
"""

from __future__ import annotations

import gymnasium

ENV_ID = "admit/TenantAdmission-v1"
ENV_ID_V0 = "admit/TenantAdmission-v0"
ENTRY_POINT = "admit.envs.env:TenantAdmissionEnv"
LAYOUT_OF_VERSION = {0: 1, 1: 2}  # env version -> observation layout (core/observation.py)
# N worlds in one kernel call (envs/vector.py), for the ids of the current layout: gymnasium.make_vec(id,
# num_envs=N, vectorization_mode="vector_entry_point"); the -v0 ids vectorise the ordinary way ("sync")
VECTOR_ENTRY_POINT = "admit.envs.vector:make_vector_env"
VECTOR_LAYOUT = 2


def scenario_env_id(scenario: str, version: int = 1) -> str:
    """The id of the env bound to one bundled scenario, e.g. ``admit/TenantAdmission-seed-paper-v1``."""
    return f"admit/TenantAdmission-{scenario}-v{version}"


def register() -> None:
    from admit.envs.scenario import bundled_scenarios, load_scenario
    from admit.envs.simulation import decision_count

    for version, layout in LAYOUT_OF_VERSION.items():
        vector = VECTOR_ENTRY_POINT if layout == VECTOR_LAYOUT else None
        gymnasium.register(id=f"admit/TenantAdmission-v{version}", entry_point=ENTRY_POINT,
                           kwargs={"layout": layout}, vector_entry_point=vector)
        for name in bundled_scenarios():
            gymnasium.register(id=scenario_env_id(name, version), entry_point=ENTRY_POINT,
                               kwargs={"scenario": name, "layout": layout},
                               max_episode_steps=decision_count(load_scenario(name)), vector_entry_point=vector)
