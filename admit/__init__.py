"""admit: learned admission control for multi-tenant LLM serving."""

__version__ = "0.1.0"


def _register() -> None:
    import gymnasium

    if "admit/TenantAdmission-v0" not in gymnasium.registry:
        gymnasium.register(id="admit/TenantAdmission-v0", entry_point="admit.envs.env:TenantAdmissionEnv")


_register()
