"""admit: train."""
