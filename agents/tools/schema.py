"""Tool arguments: the JSON schema builders the tools declare with, and the validation of the
model's JSON text against them (the subset of JSON Schema the tools use: object, array,
string, integer, boolean; required, defaults, bounds, enums, no unknown fields)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from agents.tools.base import ArgumentError, shorten

MAX_ARGUMENT_BYTES = 1_000_000
MAX_EXTRA_KEYS = 100

def string(description: str, max_length: int, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": description, "maxLength": max_length, **extra}


def integer(description: str, minimum: int, maximum: int, **extra: Any) -> dict[str, Any]:
    return {"type": "integer", "description": description, "minimum": minimum,
            "maximum": maximum, **extra}


def obj(properties: dict[str, Any], required: Sequence[str] = ()) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(required),
            "additionalProperties": False}


MAX_ID = 2**63 - 1
MAX_LINE = 100_000_000
PATH = string("Repository-relative path, '/'-separated.", 1_000, minLength=1)


# Keywords only the validation needs: tool_call enforces them whatever the model sends, so a
# request leaves them out (with every argument's description: the tool's one line and the
# names say it). Measured on the 20 tools: 13.6 KB of definitions on the wire became 4.9 KB.
VALIDATION_ONLY = frozenset({"maxLength", "minLength", "minimum", "maximum", "maxItems",
                             "default", "description"})


def lean(schema: Any) -> Any:
    """``schema`` as a request sends it: no :data:`VALIDATION_ONLY` keyword, no
    ``additionalProperties: false`` and no empty ``required`` (an empty array some servers
    refuse). A property that is itself named like a keyword is kept."""
    if isinstance(schema, list):
        return [lean(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    kept = {}
    for key, value in schema.items():
        if key == "properties":
            kept[key] = {name: lean(sub) for name, sub in value.items()}
        elif not (key in VALIDATION_ONLY or (key == "additionalProperties" and value is False)
                  or (key == "required" and not value)):
            kept[key] = lean(value)
    return kept


# --------------------------------------------------------------------------- validation


def parse_arguments(arguments: str) -> dict[str, Any]:
    """The arguments as a dict; ArgumentError when too large, not JSON or not an object."""
    # len() of a str is O(1) and a character is at least one byte, so a 10 MB string is
    # refused here without being encoded or parsed.
    if len(arguments) > MAX_ARGUMENT_BYTES or (
        len(arguments) * 4 > MAX_ARGUMENT_BYTES
        and len(arguments.encode("utf-8", "surrogatepass")) > MAX_ARGUMENT_BYTES
    ):
        raise ArgumentError("", f"arguments too large (over {MAX_ARGUMENT_BYTES} bytes of "
                                 "JSON)")
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments, parse_constant=_reject_constant)
    except json.JSONDecodeError as exc:
        raise ArgumentError("", f"arguments are not valid JSON: {exc.msg} at character "
                                 f"{exc.pos}") from None
    except (ValueError, RecursionError) as exc:
        raise ArgumentError("", f"arguments are not valid JSON: {shorten(str(exc))}") from None
    if not isinstance(value, dict):
        raise ArgumentError("", f"arguments must be a JSON object, not {_json_type(value)}")
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def validate(schema: Mapping[str, Any], value: Any, where: str) -> Any:
    """``value`` checked against ``schema`` (the subset of JSON Schema used above), with
    defaults filled in for absent object properties; ArgumentError names the field."""
    kind = schema["type"]
    label = f"`{where}`" if where else "arguments"
    if not _has_type(value, kind):
        raise ArgumentError(where, f"{label} must be {_article(kind)}, not "
                                    f"{_json_type(value)}")
    if kind == "object":
        return _validate_object(schema, value, where)
    if kind == "array":
        if len(value) > schema.get("maxItems", len(value)):
            raise ArgumentError(where, f"{label} has {len(value)} items; at most "
                                        f"{schema['maxItems']} allowed")
        return [validate(schema["items"], item, f"{where}[{i}]") for i, item in enumerate(value)]
    if kind == "string":
        _check_string(schema, value, where, label)
    low, high = schema.get("minimum", value), schema.get("maximum", value)
    if kind == "integer" and not low <= value <= high:
        raise ArgumentError(where, f"{label} must be between {low} and {high}, not {value}")
    if "enum" in schema and value not in schema["enum"]:
        raise ArgumentError(where, f"{label} must be one of {', '.join(map(str, schema['enum']))}"
                                    f"; got {shorten(repr(value))}")
    return value


def _has_type(value: Any, kind: str) -> bool:
    expected = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int}
    # bool is an int in Python, but true is not an integer in JSON.
    return isinstance(value, expected[kind]) and not (kind == "integer"
                                                      and isinstance(value, bool))


def _validate_object(schema: Mapping[str, Any], value: dict[str, Any],
                     where: str) -> dict[str, Any]:
    """Named properties are checked against their schemas; other keys are refused when
    ``additionalProperties`` is False, checked against it when it is a schema (a map such as
    probe -> cells, at most MAX_EXTRA_KEYS of them), kept as sent when it is absent."""
    properties: dict[str, Any] = schema.get("properties", {})
    prefix = f"{where}." if where else ""
    extra = schema.get("additionalProperties", True)
    unknown = sorted(set(value) - set(properties))
    if extra is False and unknown:
        name = shorten(unknown[0])
        raise ArgumentError(prefix + name, f"unknown field `{prefix}{name}`; allowed: "
                                            f"{', '.join(properties) or 'none'}")
    if isinstance(extra, Mapping) and len(unknown) > MAX_EXTRA_KEYS:
        raise ArgumentError(where, f"`{where}` has {len(unknown)} entries; at most "
                                   f"{MAX_EXTRA_KEYS} allowed")
    for key in schema.get("required", ()):
        if key not in value:
            raise ArgumentError(prefix + key, f"missing required field `{prefix}{key}`")
    checked: dict[str, Any] = {}
    for key, sub in properties.items():
        if key in value:
            checked[key] = validate(sub, value[key], prefix + key)
        elif "default" in sub:
            checked[key] = sub["default"]
    for key in unknown:
        if isinstance(extra, Mapping):
            checked[key] = validate(extra, value[key], prefix + shorten(key))
        elif extra is True:
            checked[key] = value[key]
    return checked


def _check_string(schema: Mapping[str, Any], value: str, where: str, label: str) -> None:
    if len(value) > schema.get("maxLength", len(value)):
        raise ArgumentError(where, f"{label} is too long: {len(value)} characters, at most "
                                    f"{schema['maxLength']}")
    if len(value) < schema.get("minLength", 0):
        raise ArgumentError(where, f"{label} must not be empty")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ArgumentError(where, f"{label} is not valid Unicode text (a lone surrogate)"
                             ) from None


def _json_type(value: Any) -> str:
    names = [(bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"),
             (list, "an array"), (dict, "an object")]
    return next((name for kind, name in names if isinstance(value, kind)), "null")


def _article(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def schema_hint(parameters: Mapping[str, Any]) -> str:
    fields = []
    for key, sub in parameters["properties"].items():
        optional = "" if key in parameters["required"] else ", optional"
        fields.append(f"{key} ({sub['type']}{optional})")
    return f"Send a JSON object with: {'; '.join(fields)}. No other fields."
