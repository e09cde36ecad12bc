"""admit: learned admission control for multi-tenant LLM serving.

Importing ``admit`` imports nothing else, so the gateway, the emulator and the load generator stay free of
Gymnasium, torch and SB3 (tests/test_layout.py). The env's ids are registered with Gymnasium by importing
``admit.envs`` (envs/registration.py), as Gymnasium's own envs are by ``gymnasium.envs``::

    import admit.envs, gymnasium
    env = gymnasium.make("admit/TenantAdmission-v1", scenario="seed-paper")
"""

__version__ = "0.1.0"
