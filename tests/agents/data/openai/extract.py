"""Extract the Chat Completions request schema from OpenAI's published OpenAPI document.

    git --git-dir=<clone of openai/openai-openapi>/.git show <commit>:openapi.json > openapi.json
    python tests/agents/data/openai/extract.py openapi.json <commit> \
        > tests/agents/data/openai/create_chat_completion_request.json

The whole document is 3.4 MB; the contract test needs only ``CreateChatCompletionRequest``
and the schemas it references, transitively, which this copies verbatim (59 schemas, about
50 KB) with where they came from. README.md beside it names the commit vendored.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from typing import Any

ROOT = "CreateChatCompletionRequest"
PREFIX = "#/components/schemas/"


def references(value: Any) -> Iterator[str]:
    """The schema names ``value`` refers to with ``$ref``, at any depth."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key == "$ref" and isinstance(item, str) and item.startswith(PREFIX):
                yield item[len(PREFIX):]
            else:
                yield from references(item)
    elif isinstance(value, list):
        for item in value:
            yield from references(item)


def closure(schemas: dict[str, Any], root: str) -> dict[str, Any]:
    """``root`` and every schema it reaches, sorted by name."""
    seen: set[str] = set()
    todo = [root]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(references(schemas[name]))
    return {name: schemas[name] for name in sorted(seen)}


def main(path: str, commit: str) -> None:
    with open(path, encoding="utf-8") as handle:
        document = json.load(handle)
    extracted = {
        "source": "https://github.com/openai/openai-openapi/blob/" f"{commit}/openapi.json",
        "commit": commit,
        "openapi": document["openapi"],
        "api_version": document["info"]["version"],
        "root": PREFIX + ROOT,
        "components": {"schemas": closure(document["components"]["schemas"], ROOT)},
    }
    json.dump(extracted, sys.stdout, indent=1, sort_keys=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
