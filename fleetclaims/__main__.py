"""``python -m fleetclaims`` runs the command line."""

from .cli.console import run

run()
