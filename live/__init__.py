"""admit.live: the live loop in front of a real server: control loop, stack runner, demo, sim2live."""
