"""admit.evaluate: offline policy evaluation (many seeds, common random numbers, paired tests) and the
RESULTS report."""
