"""admit: agents."""
