"""What the MCP server's tool mixins (mcp_paths.PathTools, mcp_plan.PlanningTools) use of
the server itself: one small Protocol, which ``ClaimsServer`` provides."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from mcp.types import CallToolResult

    from ..api import Registry
    from ..core.model import Claim


class ServerHost(Protocol):
    """The registry and owner a server is bound to, and its helpers: run a tool's operation
    (``call``: the result, or the error as the tool's answer), the token kept for a task,
    forgetting a token whose claim was lost, and a claim as a tool shows it."""

    registry: Registry
    owner: str

    def call(self, op: Callable[[], Any]) -> CallToolResult: ...

    def token_for(self, task: str, token: str | None) -> str: ...

    def forget_if_lost(self, task: str, op: Callable[[], Any]) -> Any: ...

    def summary(self, c: Claim) -> dict[str, Any]: ...
