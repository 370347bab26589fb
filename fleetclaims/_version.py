"""The one place the version is written: the package, the command line, the MCP server and the
distribution's metadata (pyproject.toml reads it at build time) all take it from here."""

__version__ = "0.1.0"
