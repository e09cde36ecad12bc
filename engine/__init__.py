"""admit.engine: the serving engines both the simulator and the emulator run (slot, token), their step-time
model, presets, calibration and fidelity checks."""
