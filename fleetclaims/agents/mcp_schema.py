"""A tool call's arguments checked against the inputSchema the tool publishes (tools/list).

The SDK validates arguments with pydantic in lax mode: an argument a tool does not take is
dropped (a misspelt ``types`` filter returned every event, a misspelt ``ttl`` gave the default
lease), and a value of another JSON type is coerced (``true`` became a 1-second lease, ``"5"``
a priority, ``"yes"`` true). :func:`check` refuses both before the SDK sees the call, from the
published schema itself, so a client can rely on what tools/list says: every tool's schema
carries ``additionalProperties: false`` (:func:`closed`), and a value must have a JSON type
the schema names (a boolean is not a number, a string not a number or a boolean; 5.0 is an
integer, as JSON Schema says). Ranges and lengths are left to the SDK's validation, whose
refusals the server reports the same way.

The schemas use ``type``, ``anyOf``, ``items``, ``properties`` and ``additionalProperties``
(what pydantic generates for the tools' annotations); a schema without ``type`` or ``anyOf``
(``complete``'s ``result``) takes any JSON value.
"""

from __future__ import annotations

import difflib
import json
import math
from typing import Any

from ..core.errors import ValidationError

#: how a schema's JSON type is named in a refusal ("must be a number")
_NAMES = {"null": "null", "boolean": "true or false", "integer": "an integer",
          "number": "a number", "string": "a string", "array": "a list", "object": "an object"}
#: how a value's JSON type is named ("not a string"); true, false and null name themselves
_GOT = {**_NAMES, "boolean": "a boolean", "integer": "a number"}


def shorten(text: str, limit: int = 64) -> str:
    """``text`` cut to ``limit`` characters (a name or a key may be any length)."""
    return text if len(text) <= limit else text[:limit - 3] + "..."


def closed(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` (a tool's inputSchema, changed in place) with ``additionalProperties:
    false``: what :func:`check` enforces is what the tool publishes."""
    schema["additionalProperties"] = False
    return schema


def check(tool: str, schema: dict[str, Any], arguments: dict[str, Any]) -> None:
    """Refuse (``ValidationError`` naming the argument) an argument ``tool``'s ``schema``
    does not list, or a value whose JSON type the schema refuses."""
    props: dict[str, Any] = schema.get("properties", {})
    for name in arguments:
        if name not in props:
            raise ValidationError(shorten(name), _unknown(tool, name, list(props)))
    for name, value in arguments.items():
        problem = _problem(props[name], value, name)
        if problem is not None:
            raise ValidationError(*problem[:2], value=problem[2])


def _unknown(tool: str, name: str, known: list[str]) -> str:
    if not known:
        return f"is not an argument of {tool}, which takes none"
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    takes = "It takes " if close else "it takes "
    guess = f"did you mean {close[0]!r}? " if close else ""
    return f"is not an argument of {tool}; {guess}{takes}" + ", ".join(known)


def json_type(value: Any) -> str:
    """The JSON type of a decoded JSON ``value`` ("integer" for a whole number)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _fits(wanted: Any, actual: str) -> bool:
    """Whether a value of JSON type ``actual`` is one of ``wanted`` (a type or a list)."""
    if isinstance(wanted, list):
        return any(_fits(w, actual) for w in wanted)
    return bool(wanted == actual or (wanted == "number" and actual == "integer"))


def _problem(schema: dict[str, Any], value: Any, path: str) -> tuple[str, str, Any] | None:
    """Where ``value`` (at ``path``) breaks ``schema``'s types, why, and the value to show
    (None: none); None when it does not break them."""
    if isinstance(value, float) and not math.isfinite(value):  # (NaN, Infinity: JSON has none)
        return path, f"must be a finite number, not {value!r}", None
    actual = json_type(value)
    options: list[dict[str, Any]] | None = schema.get("anyOf")
    if options is None:
        options = [schema] if "type" in schema else []
        if not options:
            return None  # any JSON value
    fitting = [o for o in options if _fits(o.get("type", actual), actual)]
    if not fitting:
        if value is None or isinstance(value, bool):
            got, shown = json.dumps(value), None
        else:
            got, shown = _GOT.get(actual, actual), value
        return path, f"must be {_describe(schema)}, not {got}", shown
    first = None
    for option in fitting:
        problem = _inside(option, value, path)
        if problem is None:
            return None
        first = first or problem
    return first


def _inside(schema: dict[str, Any], value: Any, path: str) -> tuple[str, str, Any] | None:
    """The members of a list or an object ``value`` checked against ``schema``."""
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            problem = _problem(schema["items"], item, f"{path}[{i}]")
            if problem is not None:
                return problem
    elif isinstance(value, dict):
        props: dict[str, Any] = schema.get("properties", {})
        for key, item in value.items():
            if key in props:
                problem = _problem(props[key], item, f"{path}.{shorten(key)}")
                if problem is not None:
                    return problem
            elif schema.get("additionalProperties") is False:
                return f"{path}.{shorten(key)}", "is not a member this object takes", None
    return None


def _describe(schema: dict[str, Any]) -> str:
    """What ``schema`` takes, in words: "a number", "a list of strings or null"."""
    options = schema.get("anyOf")
    if options is not None:
        return " or ".join(_describe(o) for o in options)
    wanted = schema.get("type")
    if wanted is None:
        return "any JSON value"
    if isinstance(wanted, list):
        return " or ".join(_describe({**schema, "type": w}) for w in wanted)
    if wanted == "array" and isinstance(schema.get("items"), dict) and "type" in schema["items"]:
        item = _NAMES.get(schema["items"]["type"], schema["items"]["type"])
        plural = {"a string": "strings", "an integer": "integers", "a number": "numbers",
                  "an object": "objects", "a list": "lists"}.get(item, item)
        return f"a list of {plural}"
    return _NAMES.get(str(wanted), str(wanted))


__all__ = ["check", "closed", "json_type", "shorten"]
