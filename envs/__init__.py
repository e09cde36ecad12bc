"""admit.envs: the simulated world and its Gymnasium env; importing it registers the env's ids (registration.py)."""

from admit.envs.registration import register

register()
