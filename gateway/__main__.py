"""``python -m admit.gateway`` runs the gateway like ``admit gateway``."""

import typer
from admit.gateway.cli import gateway

typer.run(gateway)
