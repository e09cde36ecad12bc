"""admit: loadgen."""
