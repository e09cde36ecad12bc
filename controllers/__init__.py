"""admit: controllers."""
