"""admit: core."""
