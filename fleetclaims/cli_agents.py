"""CLI commands for AI agents: ``mcp``, ``guard``, ``hooks`` and ``brief``.

Kept apart from :mod:`fleetclaims.cli` so those commands' imports (the MCP SDK, git) load
only when one of them runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .cli import Out

AddParser = Callable[[str, str], argparse.ArgumentParser]


def add_parsers(add: AddParser, examples: dict[str, str]) -> None:
    """Register this module's subcommands with ``add(name, help)`` (see cli.build_parser)."""


COMMANDS: dict[str, Callable[[argparse.Namespace, Out], int]] = {}
