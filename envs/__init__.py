"""admit: envs."""
