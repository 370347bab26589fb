"""Zero tracebacks (issue 18): arbitrary strings, numbers and nested JSON thrown at every public
entry point of the library and at every subcommand of the command line raise only
FleetclaimsError subclasses (the CLI: a documented exit status, never 70, never a traceback),
a refusal changes nothing, and the journal still verifies."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fc_support import file_store
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import fleetclaims
from fleetclaims import FleetclaimsError, ValidationError
from fleetclaims.cli import ALIASES, COMMANDS, build_parser, main
from fleetclaims.cli.output import EXIT_CODES

pytestmark = pytest.mark.integration

#: FC_FUZZ_EXAMPLES=5000 for a long hunt (the default keeps the module at ~15 s)
FUZZ = settings(max_examples=int(os.environ.get("FC_FUZZ_EXAMPLES", "200")), deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow, HealthCheck.data_too_large])


def _deep_key(depth: int) -> Any:
    """A tuple nested ``depth`` deep: hashable, so it can be a dict key."""
    key: Any = ()
    for _ in range(depth):
        key = (key,)
    return key


def nested(depth: int, leaf: Any = 1, mapping: bool = False) -> Any:
    """A JSON value ``depth`` containers deep, built without recursion."""
    value = leaf
    for _ in range(depth):
        value = {"k": value} if mapping else [value]
    return value


#: strings a user or a misbehaving agent sends: any code point (lone surrogates included),
#: controls, bidi overrides, huge, empty
text = st.one_of(
    st.text(alphabet=st.characters(), max_size=40),
    st.text(alphabet=st.characters(codec=None, categories=["Cs", "Cc", "Cf", "Zs"]), max_size=8),
    st.sampled_from(["", " ", "\ud800", "a\udcff", "t\u202eexe", "tâche", "x" * 5000,
                     "~nosuchuser/x", "a\x00b", "-", "--", "postgresql://", "..", "/"]),
)
number = st.one_of(
    st.integers(), st.integers(min_value=2**62, max_value=2**80), st.just(10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([-1, 0, 2**40, 2**63]),
)
json_leaf = st.one_of(st.none(), st.booleans(), number, text)
json_any = st.recursive(json_leaf, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(text, inner, max_size=4)), max_leaves=15)
deep = st.builds(nested, st.integers(min_value=15, max_value=5000), json_leaf, st.booleans())
hostile = st.one_of(text, number, json_any, deep, st.binary(max_size=12),
                    st.just(object()), st.sampled_from([None, True, False, (), set()]))


# --- the library -------------------------------------------------------------------------------


def journal_digest(reg: fleetclaims.Registry) -> str:
    """The registry's files as one digest: a refusal must leave every byte as it was.

    The registry is brought to rest first (counted refusals recorded, padding trimmed,
    claims.json at the head), so the idle keeper's own settle cannot land between the two
    digests and pass for a write by the refused call."""
    file_store(reg).settle(wait=True)
    digest = hashlib.sha256()
    for name in ("audit.jsonl", "claims.json"):
        path = Path(reg.location) / name
        digest.update(path.read_bytes() if path.exists() else b"-")
    return digest.hexdigest()


@pytest.fixture(scope="module")
def api_reg(tmp_path_factory: pytest.TempPathFactory) -> Iterator[fleetclaims.Registry]:
    reg = fleetclaims.Registry(tmp_path_factory.mktemp("tracebacks") / "reg", durability="process")
    reg.add("q1")
    yield reg
    reg.close()


def _operations(reg: fleetclaims.Registry, token: str) -> dict[str, tuple[Callable[..., Any],
                                                                          dict[str, Any]]]:
    task = {"task": "t1"}
    return {
        "claim": (reg.claim, {**task, "owner": "a", "ttl": 60, "note": "n", "priority": 1,
                              "metadata": {"k": 1}, "take_stale": False, "preempt": False,
                              "process": False}),
        "renew": (reg.renew, {**task, "token": token, "ttl": 60}),
        "release": (reg.release, {"task": "nobody", "token": token, "force": False,
                                  "reason": "r", "actor": "op"}),
        "complete": (reg.complete, {"task": "nobody", "token": token, "result": [1]}),
        "recover": (reg.recover, {**task, "owner": "b", "reason": "r", "ttl": 60, "note": "n",
                                  "priority": 1}),
        "transition": (reg.transition, {**task, "token": token, "phase": "review", "ttl": 60}),
        "handoff": (reg.handoff, {"task": "nobody", "token": token, "to_owner": "b",
                                  "note": "n", "ttl": 60}),
        "reopen": (reg.reopen, {"task": "nobody", "reason": "r", "actor": "op"}),
        "add": (reg.add, {"task": "q2", "priority": 1, "depends_on": ["q1"], "labels": ["l"],
                          "note": "n", "actor": "op"}),
        "depend": (reg.depend, {"task": "q2", "on": ["q1"], "actor": "op"}),
        "block": (reg.block, {"task": "q9", "reason": "r", "actor": "op"}),
        "unblock": (reg.unblock, {"task": "q9", "reason": "r", "actor": "op"}),
        "claim_next": (reg.claim_next, {"owner": "a", "labels": ["nothing"], "ttl": 60,
                                        "note": "n", "metadata": {}, "take_stale": False,
                                        "process": False}),
        "task": (reg.task, {"task": "q1"}),
        "tasks": (reg.tasks, {"status": ["ready"], "labels": ["l"]}),
        "ready": (reg.ready, {"labels": ["l"]}),
        "sweep": (reg.sweep, {"dry_run": True, "actor": "op"}),
        "merge": (reg.merge, {"other": "not-a-registry", "actor": "op"}),
        "explain": (reg.explain, {"task": "t1"}),
        "get": (reg.get, {"task": "t1"}),
        "claims": (reg.claims, {"owner": "a", "include_expired": True,
                                "include_completed": False, "include_released": False}),
        "claims_data": (reg.claims_data, {"owner": "a", "include_expired": True,
                                          "include_completed": False,
                                          "include_released": False}),
        "events": (reg.events, {"after": 0, "limit": 5, "types": ["claim_created"],
                                "task": "t1", "owner": "a", "since": 0, "until": None}),
        "is_stale": (reg.is_stale, {"claim": None}),
        "verdict": (reg.verdict, {"claim": None}),
        "hold": (reg.hold, {"task": "h1", "owner": "a", "ttl": 60, "note": "n", "priority": 1,
                            "metadata": {}, "take_stale": False}),
    }


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_library_raises_only_typed_errors(api_reg: fleetclaims.Registry,
                                          data: st.DataObject) -> None:
    """Any public operation with one or more hostile arguments either works or raises a
    FleetclaimsError; a ValidationError leaves every byte of the registry as it was; the
    journal verifies after each call."""
    ops = _operations(api_reg, "x" * 32)
    name = data.draw(st.sampled_from(sorted(ops)), label="operation")
    fn, kwargs = ops[name]
    kwargs = dict(kwargs)
    for key in data.draw(st.sets(st.sampled_from(sorted(kwargs)), min_size=1), label="replace"):
        kwargs[key] = data.draw(hostile, label=key)
    before = journal_digest(api_reg)
    try:
        result = fn(**kwargs)
    except ValidationError:
        assert journal_digest(api_reg) == before, f"{name} refused an argument but wrote"
    except FleetclaimsError:
        pass
    else:
        if isinstance(result, fleetclaims.Lease):
            result.release()
    assert api_reg.verify().ok


safe_path = st.one_of(text, st.binary(max_size=8), number, st.none()).map(
    lambda p: "./sub/" + p.replace("..", "_").replace("~", "_") if isinstance(p, str) else p)


@FUZZ
@given(path=safe_path, durability=hostile, lock_timeout=hostile, flag=hostile, schema=hostile,
       create=hostile)
def test_registry_constructor_raises_only_typed_errors(
    in_tmp: Path, path: Any, durability: Any, lock_timeout: Any, flag: Any, schema: Any,
    create: Any,
) -> None:
    """Registry(...) with hostile arguments (paths kept under the test's directory) opens or
    raises a FleetclaimsError; opening creates no directory."""
    before = sorted(p.name for p in in_tmp.iterdir())
    with contextlib.suppress(FleetclaimsError):  # anything else fails the property
        fleetclaims.Registry(path, durability=durability, lock_timeout=lock_timeout,
                             allow_unsafe_fs=flag, schema=schema, create=create).close()
    assert sorted(p.name for p in in_tmp.iterdir()) == before


@pytest.mark.parametrize("call", [
    lambda r: r.claim("t", owner="a", metadata={"a": "\ud800"}),
    lambda r: r.claim("t", owner="a", metadata={"\ud800": 1}),
    lambda r: r.claim("t", owner="a", ttl=10**400),
    lambda r: r.renew("t", token="x" * 32, ttl=10**400),
    lambda r: r.transition("t", token="x" * 32, phase="review", ttl=10**400),
    lambda r: r.claim_next(owner="a", ttl=10**400),
    lambda r: r.hold("t", owner="a", ttl=10**400),
    lambda r: r.events(since="yesterday"),
    lambda r: r.events(until=[1]),
    lambda r: r.events(since=math.nan),
    lambda r: r.events(after=10**30),
    lambda r: r.merge(5),
    lambda r: r.claim("t", owner="a", process=2**40),
    lambda r: r.claim("t", owner="a", process=0),
    lambda r: r.complete("t", token="x" * 32, result=nested(5000)),
    lambda r: r.claim("t", owner="a", metadata=nested(100_000, mapping=True)),
    lambda r: r.claim("t", owner="a", note="a\udcffb"),
    lambda r: r.claim("tâche", owner="a"),
    lambda r: r.tasks(status=5),
    # (a readiness filter nested deep: found by the fuzz below; str() of it recursed)
    lambda r: r.tasks(status=[nested(1992, None)]),
    lambda r: r.tasks(status=[1]),
    lambda r: r.add_many([{"id": "t", _deep_key(3000): 1}]),
    lambda r: r.claims(include_expired="yes"),
    lambda r: r.release("t", force="no", reason="r"),
    lambda r: fleetclaims.Registry(r.location, lock_timeout=math.inf),
    # (found by a probe of path reservations: a TypeError, and a limit passed by halves)
    lambda r: r.claim("t", owner="a", paths=7),
    lambda r: r.claim("t", owner="a", shared_paths=5),
    lambda r: r.claim("t", owner="a", paths=[f"e{i}" for i in range(200)],
                      shared_paths=[f"s{i}" for i in range(100)]),
])
def test_issue_inputs_are_validation_errors(tmp_path: Path,
                                            call: Callable[[fleetclaims.Registry], Any]) -> None:
    """Each input the issue found untyped is now a ValidationError, and nothing was written."""
    reg = fleetclaims.Registry(tmp_path / "reg")
    reg.sweep()
    before = journal_digest(reg)
    with pytest.raises(ValidationError):
        call(reg)
    assert journal_digest(reg) == before


def test_paths_too_long_to_open_are_typed(tmp_path: Path) -> None:
    """A path the OS refuses to look up (ENAMETOOLONG) is a registry not found, for a merge
    source and for an existing registry alike, not an OSError; nothing was written."""
    reg = fleetclaims.Registry(tmp_path / "reg")
    reg.sweep()
    before = journal_digest(reg)
    too_long = str(tmp_path / ("x" * 100_000))
    with pytest.raises(fleetclaims.RegistryNotFound, match="cannot be read"):
        reg.merge(too_long)
    with pytest.raises(fleetclaims.RegistryNotFound, match="cannot be read"):
        fleetclaims.Registry(too_long, create=False)
    assert journal_digest(reg) == before


def test_validation_error_names_the_parameter_value_and_form(tmp_path: Path) -> None:
    """The message names the parameter, the value shortened, and the accepted form."""
    reg = fleetclaims.Registry(tmp_path / "reg")
    with pytest.raises(ValidationError) as info:
        reg.claim("t", owner="a", ttl=10**400)
    assert info.value.field == "ttl" and "1s and 86400s" in str(info.value)
    assert "an integer of 1329 bits" in str(info.value)
    with pytest.raises(ValidationError) as info:
        reg.claim("tâche", owner="a")
    assert "ASCII letters" in str(info.value) and "'tâche'" in str(info.value)
    with pytest.raises(ValidationError) as info:
        reg.claim("t", owner="a", process=2**40)
    assert info.value.field == "process" and "4194304" in str(info.value)


# --- the command line --------------------------------------------------------------------------


def _options() -> dict[str, list[tuple[str, bool]]]:
    """Every subcommand -> its options (option string, takes a value)."""
    import argparse

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    found: dict[str, list[tuple[str, bool]]] = {}
    for name, p in sub.choices.items():
        found[name] = [(a.option_strings[-1], a.nargs != 0) for a in p._actions
                       if a.option_strings and a.option_strings[-1] not in ("--help", "--dir")]
    return found


OPTIONS = _options()
#: never run in-process with hostile arguments: `mcp` serves stdin, `run` runs commands
#: (both tested with real processes), `--follow` and -o/--html (paths anywhere) are left out
SKIP_COMMANDS = {"mcp", "run"}
# (--follow streams until interrupted; --wait may wait up to a week for a task an earlier
# example left held, or for work with a label nobody queued)
SKIP_OPTIONS = {"--follow", "--output", "--html", "--repo", "--wait"}


def _runs_unbounded(token: str) -> bool:
    """Whether argparse would read ``token`` as --follow or --wait: spelt out, abbreviated
    (argparse takes any unambiguous prefix), or as -f, alone or among combined short flags.
    A fuzzed value can be such a token wherever it lands in argv."""
    if token.startswith("--"):
        name = token[2:].split("=", 1)[0]
        return "follow".startswith(name) or "wait".startswith(name)
    return token.startswith("-") and "f" in token[1:]
DOCUMENTED = set(EXIT_CODES.values()) | {0, 1, 2, 3, 4, 5, 130}


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test runs in an empty directory, with the token and owner variables unset and
    the default registry (FLEETCLAIMS_DIR, from conftest) in a directory of its own."""
    monkeypatch.chdir(tmp_path)
    for name in ("FLEETCLAIMS_TOKEN", "FLEETCLAIMS_OWNER", "FLEETCLAIMS_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("FLEETCLAIMS_DIR", str(tmp_path.parent / f"{tmp_path.name}-default"))
    fleetclaims.Registry(tmp_path / "reg").add("q1")
    return tmp_path


def check_run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run ``argv`` in-process: a documented status, no traceback, and under --json a
    JSON document on stdout whenever the command failed."""
    code = main(argv)
    out, err = capsys.readouterr()
    assert code in DOCUMENTED and code != 70, (argv, code, err)
    assert "Traceback" not in err and "Traceback" not in out, (argv, err)
    if "--json" in argv and code != 0 and out.strip():
        json.loads(out.strip().split("\n")[-1])  # not splitlines: U+0085 is no line end here
    return code, err


def cli_cases() -> list[tuple[str, list[str]]]:
    """Every subcommand and alias with hostile arguments: each option in turn given a
    hostile value, positionals hostile, and JSON options nested far too deep."""
    bad_values = ["\udcff", "", "99999999999999999999999999", "-1", "nan", "1e400",
                  "[" * 5000 + "]" * 5000, '{"k": "\\ud800"}', "x" * 3000, "a\x00b",
                  "~nosuchuser/x", "\u202e"]
    cases: list[tuple[str, list[str]]] = []
    for name in sorted(set(COMMANDS) | set(ALIASES)):
        if name in SKIP_COMMANDS:
            continue
        cases.append((name, [name]))
        cases.append((name, [name, "\udcff", "\udcff"]))
        for option, takes_value in OPTIONS[name]:
            if option in SKIP_OPTIONS:
                continue
            for value in bad_values if takes_value else [""]:
                extra = [option, value] if takes_value else [option]
                cases.append((name, [name, "t1", *extra]))
        cases.append((name, [name, "t1", "--dir", ""]))
        cases.append((name, [name, "t1", "--dir", "~nosuchuser/x"]))
        where = "not-there" if name in READS else "new-dir"
        cases.append((name, [name, "t1", "--dir", where]))
    return cases


#: the subcommands that only read: a --dir that does not exist is refused, never created
READS = {"get", "show", "claims", "list", "stats", "ready", "tasks", "events", "explain", "doctor",
         "audit", "top", "brief"}


@pytest.mark.slow
def test_every_subcommand_with_hostile_arguments(in_tmp: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Every subcommand (and alias), every option given a hostile value, with and without
    --json: a documented exit status, no traceback, a JSON document for an error under
    --json; afterwards the registry verifies and no stray registry was created."""
    cases = cli_cases()
    assert len(cases) > 300
    for _, argv in cases:
        for mode in ([], ["--json"]):
            check_run([*argv, *mode, *([] if "--dir" in argv else ["--dir", "reg"])], capsys)
    assert fleetclaims.Registry(in_tmp / "reg").verify().ok
    assert not (in_tmp / "not-there").exists()
    # A write may create a registry in a directory that did not exist, always with its
    # .gitignore.
    assert (in_tmp / "new-dir" / ".gitignore").exists()


cli_value = st.one_of(text, st.builds(str, number),
                      st.builds(lambda v: json.dumps(v), json_any),
                      st.builds(lambda n: '{"k":' * n + "1" + "}" * n,
                                st.integers(min_value=15, max_value=5000)))


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_cli_fuzz(in_tmp: Path, capsys: pytest.CaptureFixture[str], data: st.DataObject) -> None:
    """A random subcommand with random options and arbitrary values: a documented exit
    status, no traceback; a usage or validation refusal (exit 2) changes nothing; the journal
    verifies."""
    name = data.draw(st.sampled_from(sorted(n for n in OPTIONS if n not in SKIP_COMMANDS)))
    argv = [name, *data.draw(st.lists(cli_value, max_size=2))]
    options = [o for o in OPTIONS[name] if o[0] not in SKIP_OPTIONS]
    for option, takes_value in data.draw(st.lists(st.sampled_from(options), max_size=4)
                                         if options else st.just([])):
        argv += [option, data.draw(cli_value)] if takes_value else [option]
    argv += ["--dir", "reg", *data.draw(st.sampled_from([[], ["--json"]]))]
    assume(not any(_runs_unbounded(token) for token in argv))
    reg = fleetclaims.Registry(in_tmp / "reg")
    before = journal_digest(reg)
    code, _ = check_run(argv, capsys)
    if code == 2:
        assert journal_digest(reg) == before, argv
    assert reg.verify().ok


# --- real processes ----------------------------------------------------------------------------


def fc(cwd: Path, *args: str | bytes, env: dict[str, str] | None = None
       ) -> subprocess.CompletedProcess[bytes]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("FLEETCLAIMS_")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "fleetclaims", *args], cwd=cwd, env=full,
                          capture_output=True, timeout=60, check=False)


@pytest.mark.parametrize(("args", "env", "code", "error"), [
    ([b"claim", b"\xff\xfe", b"--owner", b"a"], {}, 2, "invalid"),
    (["claim", "u1", "--owner", "a", "--metadata", '{"k":"\\ud800"}'], {}, 2, "invalid"),
    (["claim", "u1", "--owner", "a", "--metadata", "[" * 5000 + "]" * 5000], {}, 2, "invalid"),
    (["complete", "u1", "--token", "x" * 32, "--result", "{\"a\":" * 400 + "1" + "}" * 400],
     {}, 2, "invalid"),
    (["events", "--after", "99999999999999999999999999"], {}, 2, "invalid"),
    (["audit", "--after", "99999999999999999999999999"], {}, 2, "invalid"),
    (["claims"], {"FLEETCLAIMS_LOCK_TIMEOUT": "abc"}, 2, "invalid"),
    (["claims", "--dir", "~nosuchuser/x"], {}, 2, "invalid"),
    (["claim", "t", "--owner", "a", "--dir", ""], {}, 2, "invalid"),
    (["claims", "--dir", "nothere"], {}, 2, "no_registry"),
    (["merge", "plain", "--dir", "reg"], {}, 2, "no_registry"),
    (["migrate", "--from", "plain", "--to", "newreg"], {}, 2, "no_registry"),
    (["doctor", "--dir", "nothere"], {}, 2, "no_registry"),
])
def test_real_process_refusals(tmp_path: Path, args: list[str | bytes], env: dict[str, str],
                               code: int, error: str) -> None:
    """The issue's command lines, run as real processes: the documented exit status, one
    JSON document naming the error, no traceback, and no stray files in the directory."""
    (tmp_path / "plain").mkdir()
    fleetclaims.Registry(tmp_path / "reg").add("q1")
    before = sorted(p.name for p in tmp_path.iterdir())
    argv = [*args, *([] if "--dir" in args or "--to" in args else ["--dir", "reg"]), "--json"]
    done = fc(tmp_path, *argv, env=env)
    assert b"Traceback" not in done.stderr, done.stderr.decode(errors="replace")
    assert done.returncode == code, done.stderr
    assert json.loads(done.stdout)["error"] == error
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert sorted(p.name for p in (tmp_path / "plain").iterdir()) == []


def test_internal_error_is_one_line_exit_70(in_tmp: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug (an exception that is not a FleetclaimsError) prints one line naming the bug,
    the version and where to report it, exits 70, and under --json prints
    {"error": "internal"}."""
    from fleetclaims import __version__
    from fleetclaims.cli import claims as claims_cli

    def broken(args: Any, out: Any) -> int:
        raise KeyError("boom")

    monkeypatch.setitem(claims_cli.COMMANDS, "stats", broken)
    assert main(["stats", "--dir", "reg"]) == 70
    _, err = capsys.readouterr()
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "KeyError" in err and __version__ in err and "report" in err
    assert main(["stats", "--dir", "reg", "--json"]) == 70
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"] == "internal" and doc["version"] == __version__


def test_database_errors_are_typed(in_tmp: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A PostgreSQL role without rights (InsufficientPrivilege, 42501) that escapes a store is
    AccessDenied with the grant to ask for, as a --json document; other database errors are
    StoreUnavailable; neither is a traceback."""
    psycopg = pytest.importorskip("psycopg")
    from fleetclaims.cli import claims as claims_cli

    def denied(args: Any, out: Any) -> int:
        raise psycopg.errors.InsufficientPrivilege("permission denied for schema fleetclaims")

    monkeypatch.setitem(claims_cli.COMMANDS, "stats", denied)
    assert main(["stats", "--dir", "reg", "--json"]) == 1
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert doc["error"] == "access_denied" and "permission denied" in doc["message"]
    assert "GRANT" in err.upper() or "grant" in err

    def other(args: Any, out: Any) -> int:
        raise psycopg.errors.DiskFull("could not extend file")

    monkeypatch.setitem(claims_cli.COMMANDS, "stats", other)
    assert main(["stats", "--dir", "reg", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["error"] == "unavailable"


def test_missing_psycopg_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """On the base install (no psycopg) a postgresql:// registry is MissingDependency with
    the install command, from the library and from the command line."""
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg now fails
    for name in [n for n in sys.modules if n.startswith("fleetclaims.store.postgres")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(fleetclaims.MissingDependency) as info:
        fleetclaims.Registry("postgresql://localhost/x")
    assert "pip install 'fleetclaims[postgres]'" in str(info.value)
    assert main(["claims", "--dir", "postgresql://localhost/x", "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["error"] == "missing_dependency"


def _shell(d: Path, line: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``line`` run by sh with FC naming this interpreter's fleetclaims (redirections are the
    point: a closed or full stdout, a closed stderr)."""
    fc = f"{sys.executable} -m fleetclaims --dir {d}"
    return subprocess.run(["sh", "-c", line.replace("FC", fc)], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60, check=False)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_output_that_cannot_be_written(tmp_path: Path) -> None:
    """A closed stdout or stderr, a full one, an ASCII-only one: the exit status still says how
    the command went, nothing shows a traceback, a --json refusal is one ASCII document, and
    a claim whose output could not be written says it was recorded (it was)."""
    d = tmp_path / "r"
    note = "h\u00e9llo \u2713 \U0001f600"
    assert _shell(d, f"FC claim held --owner a --note '{note}'").returncode == 0
    cases = [  # (command line, exit status, what stderr must say)
        ("FC claims >&-", 0, ""),
        ("FC get held --json >&-", 0, ""),
        ("FC claim held --owner b 2>&-", 3, ""),
        ("FC claims --json >/dev/full", 1, "could not write to standard output"),
        ("FC claim fresh --owner a >/dev/full", 1, "what it changed is recorded"),
    ]
    for line, status, said in cases:
        done = _shell(d, line)
        assert done.returncode == status and said in done.stderr, (line, done)
        assert "Traceback" not in done.stderr + done.stdout, (line, done.stderr)
    got = fleetclaims.Registry(d).get("fresh")
    assert got is not None and got.owner == "a"  # (recorded, as the message says)
    conflict = _shell(d, "FC claim held --owner b --json 2>&-")
    assert conflict.returncode == 3 and len(conflict.stdout.splitlines()) == 1
    assert json.loads(conflict.stdout)["error"] == "conflict"
    ascii_only = {"PYTHONIOENCODING": "ascii"}
    listed = _shell(d, "FC claims", **ascii_only)
    assert listed.returncode == 0 and "held" in listed.stdout, listed
    refused = _shell(d, "FC claim t\u00e2che --owner a --json", **ascii_only)
    assert refused.returncode == 2 and json.loads(refused.stdout)["error"] == "invalid", refused
    shown = _shell(d, "FC get held --json", **ascii_only)
    assert json.loads(shown.stdout)["note"] == note  # (JSON is written as UTF-8)


def test_a_current_directory_that_was_removed_is_named(tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    done = subprocess.run(["sh", "-c", f"cd {gone} && rmdir {gone} && {sys.executable} -m "
                           "fleetclaims claims"], capture_output=True, text=True,
                          env={k: v for k, v in os.environ.items()
                               if k not in ("FLEETCLAIMS_DIR", "FLEETCLAIMS_URL")},
                          timeout=60, check=False)
    assert done.returncode == 1 and "current directory no longer exists" in done.stderr, done


@pytest.mark.parametrize("url", ["postgresql://u:secret@[::1:5432/db",
                                 "postgresql://u:secret@localhost:99999999/db"])
def test_a_malformed_postgresql_url_is_a_validation_error(url: str) -> None:
    """A URL urlsplit cannot read (an unclosed IPv6 bracket, a port out of range) is refused
    typed, without echoing it (it may hold a password); it was a bare ValueError (exit 70)."""
    with pytest.raises(ValidationError, match="not a valid PostgreSQL URL") as info:
        fleetclaims.Registry(url)
    assert "secret" not in str(info.value)


def test_json_without_a_command_answers_a_json_error(capsys: pytest.CaptureFixture[str]) -> None:
    """`fleetclaims --json` alone printed the help text on stdout (not JSON), exit 2."""
    import json

    from fleetclaims.cli import main

    assert main(["--json"]) == 2
    doc = json.loads(capsys.readouterr().out)
    assert doc["error"] == "invalid" and doc["field"] == "command"
    assert main([]) == 2
    assert "usage:" in capsys.readouterr().out  # (without --json: the help, as before)
