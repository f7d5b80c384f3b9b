"""The Chat Completions request as OpenAI's published OpenAPI schema says it must be.

:func:`request_problems` validates one request body (as it arrived at the stub) against the
vendored ``CreateChatCompletionRequest`` (tests/agents/data/openai/, its README names the
commit), plus the rules OpenAI's server enforces that the schema leaves out:

- **no empty arrays** in the request's own fields: the server answers 400 ``empty_array``
  ("Expected an array with minimum length 1") to ``"tool_calls": []`` or ``"tools": []``
  (openai/openai-python#2061, openai/openai-node#1341). A tool's ``parameters`` is the tool's
  own JSON Schema and is left alone;
- **an assistant message says something**: content that is not null, or tool calls
  ("Required unless tool_calls or function_call is specified", the schema's own words);
- **every tool result answers a call** of the assistant message before it, and every call
  of an assistant message gets its result before the next non-tool message.

The document is OpenAPI 3.1 but still marks some fields ``nullable: true`` (3.0's keyword,
which JSON Schema 2020-12 ignores); it is read as "null is allowed too", as OpenAPI meant it.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

SCHEMA = Path(__file__).parent / "data" / "openai" / "create_chat_completion_request.json"


def _nullable(value: Any) -> Any:
    """``nullable: true`` as JSON Schema says it: ``anyOf`` the schema or null."""
    if isinstance(value, list):
        return [_nullable(item) for item in value]
    if not isinstance(value, dict):
        return value
    converted = {key: _nullable(item) for key, item in value.items() if key != "nullable"}
    if value.get("nullable") is True:
        return {"anyOf": [converted, {"type": "null"}]}
    return converted


@cache
def validator() -> Draft202012Validator:
    vendored = json.loads(SCHEMA.read_text(encoding="utf-8"))
    document = {"$ref": vendored["root"], "components": _nullable(vendored["components"])}
    return Draft202012Validator(document)


def request_problems(body: Any) -> list[str]:
    """Every way ``body`` breaks the schema or the server's rules above; [] when none."""
    problems = [f"{'/'.join(map(str, error.absolute_path)) or '(body)'}: {error.message[:300]}"
                for error in validator().iter_errors(body)]
    if isinstance(body, dict):
        problems += _empty_arrays(body, "")
        problems += _conversation_problems(body.get("messages") or [])
    return problems


def _empty_arrays(value: Any, where: str) -> list[str]:
    if isinstance(value, list):
        if not value:
            return [f"{where}: empty array (the server answers 400 empty_array)"]
        return [p for i, item in enumerate(value) for p in _empty_arrays(item, f"{where}/{i}")]
    if isinstance(value, dict):
        return [p for key, item in value.items() if key != "parameters"
                for p in _empty_arrays(item, f"{where}/{key}")]
    return []


def _conversation_problems(messages: list[Any]) -> list[str]:
    problems = []
    open_calls: set[str] = set()
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "tool":
            if message.get("tool_call_id") not in open_calls:
                problems.append(f"messages/{index}: a tool result answers no open call")
            open_calls.discard(str(message.get("tool_call_id")))
            continue
        if open_calls:
            problems.append(f"messages/{index}: calls {sorted(open_calls)} got no result")
            open_calls = set()
        if role == "assistant":
            calls = message.get("tool_calls") or []
            if message.get("content") is None and not calls:
                problems.append(f"messages/{index}: an assistant message with neither content "
                                "nor tool calls")
            open_calls = {str(call.get("id")) for call in calls if isinstance(call, dict)}
    if open_calls:
        problems.append(f"the last calls {sorted(open_calls)} got no result")
    return problems
