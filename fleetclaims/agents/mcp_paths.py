"""The MCP server's path-reservation tools (#23): ``reserve`` and ``unreserve``, and the
``paths``/``shared_paths`` arguments that ``claim`` and ``claim_next`` take.

A base class of ``ClaimsServer`` (kept apart so each module stays readable). The server
keeps each claim's token, so an agent names only the task and the patterns.
"""

from __future__ import annotations

from typing import Annotated

from mcp.types import CallToolResult  # at run time: the SDK reads the annotations
from pydantic import Field

from .mcp_host import ServerHost

Task = Annotated[str, Field(max_length=200, description="The task id, e.g. 'issue-42'.")]
Paths = Annotated[list[str] | None, Field(
    max_length=256, description="Path patterns to reserve exclusively, relative to the "
    "repository root, gitignore-style: 'src/parser/**', 'tests/test_parser.py', "
    "'**/*.md' (`*` stays within a directory, `**` crosses them; a directory covers "
    "everything under it; compared case-insensitively). Another agent's overlapping "
    "reservation refuses the call, naming it; the git guard refuses commits to paths "
    "others reserved.")]
SharedPaths = Annotated[list[str] | None, Field(
    max_length=256, description="Path patterns to reserve shared: they coexist with other "
    "agents' shared reservations, not with an exclusive one.")]

TOOLS = {
    "reserve": "Reserve more paths (`paths` exclusive, `shared_paths` shared) with a task you "
               "hold. Refused with a conflict naming the other claim, its task and the "
               "overlapping patterns.",
    "unreserve": "Drop path reservations from a task you hold (`paths` as reserved; all of "
                 "them when omitted), so others may reserve them.",
}


class PathTools(ServerHost):
    """``reserve`` and ``unreserve``."""

    def reserve(self, task: Task, paths: Paths = None, shared_paths: SharedPaths = None,
                ) -> CallToolResult:
        return self.call(lambda: self.summary(self.forget_if_lost(task, lambda: (
            self.registry.reserve(task, token=self.token_for(task, None), paths=paths,
                                  shared_paths=shared_paths)))))

    def unreserve(self, task: Task, paths: Annotated[list[str] | None, Field(
            max_length=256, description="The patterns to drop, as reserved; omit for all."
            )] = None) -> CallToolResult:
        return self.call(lambda: self.summary(self.forget_if_lost(task, lambda: (
            self.registry.unreserve(task, token=self.token_for(task, None), paths=paths)))))
