"""One vocabulary: the CLI's subcommands and the MCP tools are derived from Registry's public
methods (minus an explicit table of what is deliberately not exposed, with reasons); the older
names stay as aliases; the exit codes of typed errors come from the one CLI table."""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import pytest

import fleetclaims.core.errors as core_errors
from fleetclaims import Registry
from fleetclaims.cli import ALIASES, COMMANDS, _command_of, all_commands, build_parser, main
from fleetclaims.cli.output import EXIT_CODES, exit_code, exit_code_of

pytestmark = pytest.mark.integration  # one test runs the CLI on a file registry

#: Registry methods the command line does not offer as a subcommand of their own, and why.
NOT_ON_CLI = {
    "task": "`get TASK` shows the task's queue entry with its claim",
    "claims_data": "the fast path of `claims --json` (the same claims as dicts)",
    "is_stale": "`get TASK` and `claims` report whether a claim is stale",
    "verdict": "`get TASK` reports the owner's liveness verdict",
    "verify": "a review step: `audit verify`, beside the rest of the audit log tools",
    "hold": "a context manager for library code; `run TASK -- CMD` holds a claim for a command",
    "close": "closes a library handle; each command opens and closes its own",
    "add_many": "`add --from FILE` (JSON Lines or one JSON list, one transaction)",
}

#: subcommands that are not Registry methods: tools around the registry.
CLI_ONLY = {"doctor", "init", "audit", "top", "run", "migrate", "db", "mcp", "guard", "hooks",
            "brief"}

#: Registry methods an agent's MCP server does not offer, and why.
NOT_ON_MCP = {
    **{k: v for k, v in NOT_ON_CLI.items() if k != "add_many"},  # add_many is a tool
    "reopen": "reopening finished work is a reviewer's decision (the CLI)",
    "tasks": "the whole queue is for planning; ready and brief show what an agent may take",
    "merge": "reads another registry's files from disk: an operator's step (the CLI)",
    "sync": "talks to the repository's git remote (network, git's credential helpers): an "
            "operator's step (the CLI)",
    "stats": "brief, ready and claim_next return the counts an agent needs",
    "prune": "retention of the live state is an operator's decision (the CLI)",
}

#: tools that are not Registry methods
MCP_ONLY = {"brief"}


def registry_methods() -> set[str]:
    return {name for name, member in inspect.getmembers(Registry)
            if not name.startswith("_") and callable(member)}


def test_cli_subcommands_are_the_registry_methods() -> None:
    """Every public Registry method is a subcommand spelt with dashes, or listed with a reason
    in NOT_ON_CLI; nothing else is a subcommand except the CLI_ONLY tools."""
    methods = registry_methods()
    assert set(NOT_ON_CLI) <= methods, "NOT_ON_CLI names a method Registry no longer has"
    expected = {m.replace("_", "-") for m in methods - set(NOT_ON_CLI)} | CLI_ONLY
    assert set(COMMANDS) == expected
    assert set(all_commands()) == set(COMMANDS)  # the static index matches the modules


def test_every_subcommand_is_in_the_module_the_index_names() -> None:
    """cli.COMMANDS (read by a cold command to import one module) names each command's module."""
    import importlib

    for name, group in COMMANDS.items():
        module = importlib.import_module(f"fleetclaims.cli.{group}")
        assert name in module.COMMANDS, (name, group)


def test_older_cli_names_are_aliases_of_canonical_ones() -> None:
    """show, list and next still parse, as get, claims and claim-next, cold or not."""
    assert ALIASES == {"show": "get", "list": "claims", "next": "claim-next"}
    for old, new in ALIASES.items():
        assert new in COMMANDS and old not in COMMANDS
        assert _command_of(["--dir", "x", old]) == new
        for parser in (build_parser(), build_parser(old)):
            args = parser.parse_args([old, "t"] if new == "get" else
                                     [old, "--owner", "o"] if new == "claim-next" else [old])
            assert args.command == old


def test_old_and_new_cli_names_do_the_same(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """get/show, claims/list, claim-next/next, tasks/claims --tasks and handoff
    --to-owner/--to behave alike."""
    d = str(tmp_path / "r")
    reg = Registry(d)
    reg.add("q1")
    reg.add("q2")
    reg.close()

    def run(*args: str) -> tuple[int, str]:
        code = main([*args, "--dir", d, "--json"])
        return code, capsys.readouterr().out

    code, out = run("claim-next", "--owner", "a")
    assert code == 0 and json.loads(out)["task"] == "q1"
    code, out = run("next", "--owner", "b")
    assert code == 0 and json.loads(out)["task"] == "q2"
    assert run("next", "--owner", "c")[0] == 3 == run("claim-next", "--owner", "c")[0]
    assert json.loads(run("get", "q1")[1])["owner"] == "a"
    assert json.loads(run("show", "q1")[1])["owner"] == "a"
    listed = [c["task"] for c in json.loads(run("claims")[1])]
    assert listed == [c["task"] for c in json.loads(run("list")[1])] == ["q1", "q2"]
    queued = run("tasks")[1]
    assert [t["task"] for t in json.loads(queued)] == ["q1", "q2"]
    assert queued == run("claims", "--tasks")[1] == run("list", "--tasks")[1]
    token = json.loads(run("claim", "h", "--owner", "a")[1])["token"]
    code, out = run("handoff", "h", "--token", token, "--to-owner", "b")
    assert code == 0 and json.loads(out)["owner"] == "b"
    code, out = run("handoff", "h", "--token", json.loads(out)["token"], "--to", "c")
    assert code == 0 and json.loads(out)["owner"] == "c"


def test_mcp_tools_are_the_registry_methods() -> None:
    """Every public Registry method is an MCP tool of the same name (and a method of the
    server), or listed with a reason in NOT_ON_MCP; older names are aliases of tools."""
    pytest.importorskip("mcp")
    from fleetclaims.agents.mcp_server import ALIASES as MCP_ALIASES
    from fleetclaims.agents.mcp_server import TOOLS, ClaimsServer

    methods = registry_methods()
    assert set(NOT_ON_MCP) <= methods, "NOT_ON_MCP names a method Registry no longer has"
    assert set(TOOLS) == (methods - set(NOT_ON_MCP)) | MCP_ONLY
    for name in TOOLS:
        assert callable(getattr(ClaimsServer, name)), name
    assert MCP_ALIASES == {"show": "get", "list": "claims", "next": "claim_next"}
    assert set(MCP_ALIASES.values()) <= set(TOOLS) and not set(MCP_ALIASES) & set(TOOLS)
    # The CLI and MCP use the same names, spelt with dashes on the command line.
    assert {v.replace("_", "-") for v in MCP_ALIASES.values()} == set(ALIASES.values())


#: the documented exit status of every error class (README, "Errors and exit codes")
DOCUMENTED_EXIT = {
    "FleetclaimsError": 1, "RegistryBusy": 1, "DurabilityError": 1, "UnsafeRegistry": 1,
    "StoreUnavailable": 1, "UnknownTask": 1,
    "StoreReadOnly": 1, "StoreOverloaded": 1, "SchemaMismatch": 1,
    "RegistryNotFound": 2, "AccessDenied": 1, "MissingDependency": 1,
    "ValidationError": 2, "DependencyCycle": 2,
    "ClaimConflict": 3, "PathConflict": 3, "TaskCompleted": 3, "TaskNotReady": 3,
    "NotHolder": 4, "LeaseExpired": 4, "ClaimSuperseded": 4,
    "RegistryCorrupt": 5, "AuditCorrupt": 5, "HistoryLost": 5, "SegmentDamaged": 5,
    "ArchiveMismatch": 5,
    "RemoteUnavailable": 1, "RemoteRewritten": 5, "GitFailed": 1,
}


def test_every_error_exits_with_its_documented_code() -> None:
    """The CLI table gives each error class its documented exit status, by instance and by
    code alone (the guard has only the code); a new error class must be added here."""
    classes = {name: cls for name, cls in vars(core_errors).items()
               if isinstance(cls, type) and issubclass(cls, core_errors.FleetclaimsError)}
    assert set(classes) == set(DOCUMENTED_EXIT)
    for name, cls in classes.items():
        exc = cls.__new__(cls)  # the status depends on the class, not on the data
        assert exit_code_of(exc) == DOCUMENTED_EXIT[name], name
        assert exit_code(cls.code) == DOCUMENTED_EXIT[name], name
    assert exit_code("ok") == 0 and exit_code("usage") == 2 and exit_code("nothing_ready") == 3
    assert exit_code("fence_mismatch") == 4 == exit_code("stale")
    assert set(EXIT_CODES.values()) <= {0, 1, 2, 3, 4, 5}


def test_a_new_subclass_exits_like_its_parent() -> None:
    """An error class without a table entry of its own takes its nearest parent's status."""

    class Hijacked(core_errors.NotHolder):
        code = "hijacked"

    assert exit_code_of(Hijacked.__new__(Hijacked)) == 4
    assert exit_code("hijacked") == 1  # by code alone, unknown codes are plain errors


def test_core_errors_know_nothing_of_exit_codes() -> None:
    """core/errors.py carries codes and data only: no exit statuses, no EXIT_ constants."""
    tree = ast.parse(Path(core_errors.__file__).read_text(encoding="utf-8"))
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    assigned = {t.id for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                if isinstance(t, ast.Name)}
    assert not {n for n in names | assigned if n.startswith("EXIT_") or n == "exit_code"}


def test_cli_modules_import_downward_only() -> None:
    """No import circle in cli/: output < args < command modules < __init__ < console, and
    the command modules' imports of each other form no cycle."""
    cli_dir = Path(main.__code__.co_filename).parent
    modules = {p.stem for p in cli_dir.glob("*.py")}
    layer = {"output": 0, "args": 1, "__init__": 3, "console": 4}
    edges: dict[str, set[str]] = {}
    for path in cli_dir.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.ImportFrom) and node.level == 1):
                continue
            if node.module:
                targets = {node.module.split(".")[0]}
            else:
                targets = {a.name if a.name in modules else "__init__" for a in node.names}
            for target in targets:
                mine, theirs = layer.get(path.stem, 2), layer.get(target, 2)
                assert theirs <= mine, (path.name, "imports", target)
                if theirs == mine:
                    edges.setdefault(path.stem, set()).add(target)

    def reaches(start: str, goal: str, seen: set[str]) -> bool:
        return any(n == goal or (n not in seen and reaches(n, goal, seen | {n}))
                   for n in edges.get(start, ()))

    assert not [m for m in edges if reaches(m, m, set())]


def test_readme_command_reference_names_every_subcommand_and_alias() -> None:
    """The README's command reference shows every canonical subcommand and names each alias."""
    import re

    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Command reference", 1)[1].split("\n## ", 1)[0]
    for name in COMMANDS:
        assert re.search(rf"`{re.escape(name)}[ `]", section), name
    for old in ALIASES:
        assert f"(alias `{old}`)" in section, old
