"""``python -m fleetclaims`` runs the command line."""

from .console import run

run()
