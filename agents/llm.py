"""The LLM boundary: one Chat Completions turn with tools against any OpenAI-compatible endpoint.

This is the only module that imports ``openai`` (docs/style.md rule 4). It imports no Django: the
caller builds an :class:`LLMConfig` from settings (or a goal's override) and passes it in.

Contracts:

- **Nothing secret is sent.** :func:`chat` redacts the configured API key and every string in
  ``secrets`` from the messages and the tool definitions before they leave the process, plus the
  key shapes in :data:`SECRET_PATTERNS`. The API key travels only in the ``Authorization``
  header. Error messages are redacted the same way, since endpoints echo keys back
  ("Incorrect API key provided: sk-...").
- **Bounded time.** Every HTTP request has ``config.timeout`` in all, from its connection to
  the last byte of the answer (:class:`_Deadline`): each read and write waits at most what is
  left, so a server that trickles its answer a byte at a time, each within any per-read timeout,
  is cut off when the request's time is up, like one that never answers. A proxy that the
  environment names (HTTPS_PROXY, NO_PROXY and the like) is used as httpx uses it, its
  connections bounded the same way. The client's own retries are off; this module retries so
  that Retry-After is respected:

  ======================================  ==================================================
  answer                                  what happens
  ======================================  ==================================================
  429, Retry-After <= max_inline_wait     sleep that long, retry (counts toward max_retries)
  429, Retry-After longer or absent       :class:`LLMRetryLater` (Retry-After, or 30 s)
  429 with no retries left                :class:`LLMRetryLater` with the server's wait
  5xx, connection error, timeout          backoff 0.5 s, 1 s, 2 s ... then :class:`LLMError`
                                          with ``transient`` (the caller retries for longer)
  5xx with Retry-After > max_inline_wait  :class:`LLMRetryLater` (e.g. 503 for maintenance)
  other 4xx                               :class:`LLMError` at once
  200 that is not a chat completion       :class:`LLMMalformed` (not retried)
  ======================================  ==================================================

  Worst case: ``(max_retries + 1) * timeout + 0.5 * (2**max_retries - 1)`` seconds, plus inline
  Retry-After waits of at most ``max_inline_wait`` each.
- **Raw tool arguments.** ``ToolCall.arguments`` is the exact JSON text the model sent, of any
  size; validating it is the tools layer's job, so a malformed call can be answered with a
  structured error instead of failing the turn.
"""

from __future__ import annotations

import base64
import email.utils
import json
import math
import re
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import httpcore2
    import httpx2
    import openai
    from openai.types.chat import ChatCompletionMessageParam, ChatCompletionToolUnionParam

REDACTED = "[REDACTED]"

# Literal secrets shorter than this are not redacted: replacing every "root" or "1234" in the
# code the agent reads would corrupt it, and such values are not secret anyway.
MIN_SECRET_LENGTH = 6

DEFAULT_RETRY_LATER = 30.0  # a 429 without a usable Retry-After
_BACKOFF_BASE = 0.5
_BODY_EXCERPT = 300


@dataclass(frozen=True)
class KeyShape:
    """A kind of secret recognised by its shape. ``needles`` are plain substrings, one of which
    every match contains: a cheap ``in`` test skips the regex on the megabytes of code and
    probe output that contain none (measured: 10 MB through six regexes took 1.1 s)."""

    description: str
    pattern: re.Pattern[str]
    replacement: str
    needles: tuple[str, ...]

    def sub(self, text: str) -> str:
        if any(needle in text for needle in self.needles):
            return self.pattern.sub(self.replacement, text)
        return text


# Each pattern starts with a literal where it can, which lets the regex engine skip ahead.
SECRET_PATTERNS: tuple[KeyShape, ...] = (
    KeyShape(
        "API keys shaped sk-... (OpenAI sk-proj-, Anthropic sk-ant-, DeepSeek, ...): sk- not "
        "inside a word, then at least 20 key characters",
        re.compile(r"sk-(?<![A-Za-z0-9]sk-)[A-Za-z0-9_-]{20,}"),
        REDACTED,
        ("sk-",),
    ),
    KeyShape(
        "bearer tokens (Authorization headers, curl lines): Bearer or bearer, then 8 or more "
        "token characters; the word is kept",
        re.compile(r"earer(?<=\b[Bb]earer)(\s+)[A-Za-z0-9._~+/=-]{8,}"),
        r"earer\g<1>" + REDACTED,
        ("earer",),
    ),
    KeyShape(
        "the same in capitals (BEARER)",
        re.compile(r"EARER(?<=\bBEARER)(\s+)[A-Za-z0-9._~+/=-]{8,}"),
        r"EARER\g<1>" + REDACTED,
        ("EARER",),
    ),
    KeyShape(
        "GitHub tokens: ghp_, gho_, ghu_, ghs_, ghr_, github_pat_",
        re.compile(
            r"gh(?<![A-Za-z0-9_]gh)(?:[pousr]_[A-Za-z0-9]{30,}|ithub_pat_[A-Za-z0-9_]{22,})"
        ),
        REDACTED,
        ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    ),
    KeyShape(
        "AWS access key ids: AKIA or ASIA and 16 capitals or digits",
        re.compile(r"A(?<![A-Za-z0-9]A)[KS]IA[0-9A-Z]{16}\b"),
        REDACTED,
        ("AKIA", "ASIA"),
    ),
    KeyShape(
        "the password in a URL's user part, as in postgres://user:password@host (user kept)",
        re.compile(r"://([^/\s:@]*):[^/\s@]+@"),
        r"://\g<1>:" + REDACTED + "@",
        ("://",),
    ),
    KeyShape(
        "PEM private key blocks, BEGIN to END (up to 16 KiB)",
        re.compile(
            r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]{0,16384}?"
            r"-----END [A-Z0-9 ]*PRIVATE KEY-----"
        ),
        REDACTED,
        ("PRIVATE KEY-----",),
    ),
)


@dataclass(frozen=True)
class LLMConfig:
    """Where and how to ask. Built by the caller from settings; ``api_key`` may be empty for
    local servers that take none (a placeholder is then sent, since the client insists)."""

    base_url: str
    api_key: str
    model: str
    timeout: float = 60.0  # per HTTP request
    max_retries: int = 2  # for 5xx / connection errors / short 429s
    max_inline_wait: float = 10.0  # a Retry-After up to this is slept in place
    price_in_per_mtok: float = 0.0  # USD per million prompt tokens
    price_out_per_mtok: float = 0.0  # USD per million completion tokens

    def __post_init__(self) -> None:
        if not self.base_url or not self.model:
            raise ValueError("LLMConfig needs a base_url and a model")
        if not (self.timeout > 0 and math.isfinite(self.timeout)):
            raise ValueError(f"LLMConfig.timeout must be a positive number, not {self.timeout!r}")
        if self.max_retries < 0 or self.max_inline_wait < 0:
            raise ValueError("LLMConfig.max_retries and max_inline_wait must not be negative")
        if self.price_in_per_mtok < 0 or self.price_out_per_mtok < 0:
            raise ValueError("LLMConfig prices must not be negative")

    @property
    def endpoint(self) -> str:
        """The URL requests go to, for messages (credentials in it are redacted)."""
        return redact(f"{self.base_url.rstrip('/')}/chat/completions", ())


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the raw JSON text the model sent; the tools layer validates it


@dataclass(frozen=True)
class LLMReply:
    """The model's answer. ``reasoning``: a reasoning model's thinking where the server sends
    it (``reasoning_content``, or ``reasoning``), for people to read; it is never sent back."""

    content: str | None
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    reasoning: str | None = None


class LLMError(Exception):
    """The turn failed; the message is one redacted sentence naming the endpoint, the status
    (``status_code``, None when no HTTP answer came) and the start of the body.

    ``transient``: a later try may succeed (5xx, timeouts, refused or cut connections, a 200
    that is not a chat completion); False for what no retry fixes (401, 403, 404, 400 ...)."""

    def __init__(self, message: str, *, status_code: int | None = None,
                 transient: bool = False) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.transient = transient


class LLMRetryLater(LLMError):
    """Rate limited for longer than is worth sleeping in a worker: re-schedule the step in
    ``retry_after`` seconds instead."""

    def __init__(self, message: str, *, retry_after: float, status_code: int | None = 429) -> None:
        super().__init__(message, status_code=status_code, transient=True)
        self.retry_after = retry_after


class LLMMalformed(LLMError):
    """The endpoint answered 200 with something that is not a chat completion (a proxy's
    error page, a half-written body): transient, since the next answer may be whole."""

    def __init__(self, message: str, *, status_code: int | None = 200) -> None:
        super().__init__(message, status_code=status_code, transient=True)


# --- redaction ---------------------------------------------------------------------------


def _secret_forms(secret: str) -> set[str]:
    """The secret as written, as it appears inside JSON text (a tool call's arguments), as
    it appears percent-encoded in a URL (a DATABASE_URL password) and base64-encoded."""
    forms = {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}
    forms.add(urllib.parse.quote(secret, safe=""))
    forms.add(urllib.parse.quote_plus(secret, safe=""))
    forms |= _base64_forms(secret.encode())
    return {form for form in forms if len(form) >= MIN_SECRET_LENGTH}


def _base64_forms(secret: bytes) -> set[str]:
    """What any base64 text holding ``secret`` contains, wherever the secret starts: base64
    encodes 3 bytes as 4 characters, so for each of the 3 alignments the whole groups of the
    secret's bytes encode the same way (standard and URL-safe alphabets). At most 2 bytes at
    each end stay unredacted."""
    forms = set()
    for skip in range(3):
        body = secret[skip:]
        body = body[: len(body) - len(body) % 3]
        forms |= {base64.b64encode(body).decode(), base64.urlsafe_b64encode(body).decode()}
    return forms


def _redactor(secrets: Sequence[str]) -> Callable[[str], str]:
    """The function that redacts one string. Literal secrets go longest first, so a secret
    containing another is removed whole; ``str.replace`` is several times faster than one
    regex alternation of them on large text."""
    forms = {
        form
        for secret in secrets
        if len(secret) >= MIN_SECRET_LENGTH
        for form in _secret_forms(secret)
    }
    literals = sorted(forms, key=len, reverse=True)

    def apply(text: str) -> str:
        for literal in literals:
            text = text.replace(literal, REDACTED)
        for shape in SECRET_PATTERNS:
            text = shape.sub(text)
        return text

    return apply


def redact(text: str, secrets: Sequence[str]) -> str:
    """``text`` with every secret of at least :data:`MIN_SECRET_LENGTH` characters (also in its
    JSON-escaped and percent-encoded forms) and every :data:`SECRET_PATTERNS` match replaced by
    ``[REDACTED]``."""
    return _redactor(secrets)(text)


def _redact_value(value: Any, apply: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return apply(value)
    if isinstance(value, Mapping):
        return {
            _redact_value(key, apply): _redact_value(item, apply) for key, item in value.items()
        }
    if isinstance(value, list | tuple):
        return [_redact_value(item, apply) for item in value]
    return value  # numbers, booleans and None: immutable, nothing to hide


def redact_messages(messages: list[dict[str, Any]], secrets: Sequence[str]) -> list[dict[str, Any]]:
    """A deep copy of ``messages`` (or tool definitions) with :func:`redact` applied to every
    string in it: contents, tool call arguments, names, keys. Tuples become lists (JSON has
    only arrays). The input is not modified."""
    apply = _redactor(secrets)
    return [cast("dict[str, Any]", _redact_value(message, apply)) for message in messages]


# --- one request's deadline ------------------------------------------------------------------


class _Deadline:
    """The time left to the request in flight. httpx's timeouts are per read: a server that
    sends a byte every few seconds never trips one, and would hold an agent worker for as long
    as it likes. The client's network streams ask this how long each connect, read and write
    may wait, and time out once nothing is left."""

    def __init__(self) -> None:
        self.at = math.inf

    def start(self, seconds: float) -> None:
        self.at = time.monotonic() + seconds

    def wait(self, timeout: float | None, error: type[Exception]) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise error("the request's time is up")
        return left if timeout is None else min(timeout, left)


class _DeadlineStream:
    """A connection whose every wait ends by the request's deadline (httpcore's NetworkStream
    interface)."""

    def __init__(self, inner: httpcore2.NetworkStream, deadline: _Deadline) -> None:
        self._inner, self._deadline = inner, deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        import httpcore2

        return self._inner.read(max_bytes, self._deadline.wait(timeout, httpcore2.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        import httpcore2

        self._inner.write(buffer, self._deadline.wait(timeout, httpcore2.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> _DeadlineStream:
        import httpcore2

        wait = self._deadline.wait(timeout, httpcore2.ConnectTimeout)
        return _DeadlineStream(self._inner.start_tls(ssl_context, server_hostname, wait),
                               self._deadline)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _DeadlineBackend:
    """httpcore's own network backend, its connections bounded by the deadline (httpcore's
    NetworkBackend interface)."""

    def __init__(self, deadline: _Deadline) -> None:
        import httpcore2

        self._inner, self._deadline = httpcore2.SyncBackend(), deadline

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None, socket_options: Any = None
                    ) -> _DeadlineStream:
        import httpcore2

        wait = self._deadline.wait(timeout, httpcore2.ConnectTimeout)
        return _DeadlineStream(self._inner.connect_tcp(host, port, wait, local_address,
                                                       socket_options), self._deadline)

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Any = None) -> _DeadlineStream:
        import httpcore2

        wait = self._deadline.wait(timeout, httpcore2.ConnectTimeout)
        return _DeadlineStream(self._inner.connect_unix_socket(path, wait, socket_options),
                               self._deadline)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


def _http_client(deadline: _Deadline, timeout: float) -> httpx2.Client:
    """The HTTP client of one turn, as httpx builds it, the proxies the environment names
    mounted as usual; each of its connection pools, the direct one and each proxy's, opens its
    connections through a backend that keeps `deadline`. (A client given a transport of its
    own ignores the environment's proxies: a host that reaches its model only through one
    could not reach it at all.)"""
    import httpx2

    client = httpx2.Client(timeout=timeout, follow_redirects=True)
    backend = cast("httpcore2.NetworkBackend", _DeadlineBackend(deadline))
    for transport in (client._transport, *client._mounts.values()):
        if transport is not None:  # None: a NO_PROXY host, sent through client._transport
            # httpx's own transports (direct, HTTP or SOCKS proxy) keep an httpcore pool that
            # reads its backend when it opens a connection: the one way in for a backend.
            cast("httpx2.HTTPTransport", transport)._pool._network_backend = backend
    return client


# --- the turn ------------------------------------------------------------------------------


def chat(
    config: LLMConfig,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    *,
    secrets: Sequence[str] = (),
    on_wait: Callable[[float, int, str], None] | None = None,
) -> LLMReply:
    """One Chat Completions turn (``tool_choice="auto"``; with no tools, neither ``tools`` nor
    ``tool_choice`` is sent, since endpoints reject an empty list). Redacts ``secrets`` and
    ``config.api_key`` from everything sent. Retries and raises as the module docstring says;
    ``on_wait(seconds, attempt, reason)`` is told of each wait before it is slept.
    """
    # Imported here, not at the top: the client library took 0.4 s of every web and worker
    # process's start (python -X importtime), most of which never call a model.
    import openai

    hidden = (*secrets, config.api_key)
    apply = _redactor(hidden)
    sent_messages = cast(
        "list[ChatCompletionMessageParam]", [_redact_value(message, apply) for message in messages]
    )
    sent_tools = cast(
        "list[ChatCompletionToolUnionParam]", [_redact_value(tool, apply) for tool in tools]
    )
    deadline = _Deadline()
    with openai.OpenAI(
        base_url=config.base_url,
        api_key=config.api_key or "unused",
        timeout=config.timeout,
        max_retries=0,
        http_client=_http_client(deadline, config.timeout),
    ) as client:
        attempt = 0
        while True:
            final = attempt >= config.max_retries
            deadline.start(config.timeout)
            try:
                raw = client.chat.completions.with_raw_response.create(
                    model=config.model,
                    messages=sent_messages,
                    tools=sent_tools if sent_tools else openai.omit,
                    tool_choice="auto" if sent_tools else openai.omit,
                )
                body = raw.content  # read inside the try: a body cut short is a connection error
            except openai.APIStatusError as err:
                wait = _wait_after_status(err, config, apply, attempt=attempt, final=final)
                reason = f"the endpoint answered {err.status_code}"
            except openai.APITimeoutError as err:
                if final:
                    raise LLMError(
                        f"LLM endpoint {config.endpoint} did not answer within "
                        f"{config.timeout:g} s{_attempts(attempt)}", transient=True
                    ) from err
                wait, reason = _backoff(attempt), f"no answer within {config.timeout:g} s"
            except openai.APIConnectionError as err:
                cause = apply(str(err.__cause__ or err))[:_BODY_EXCERPT]
                if final:
                    raise LLMError(
                        f"LLM endpoint {config.endpoint} could not be reached"
                        f"{_attempts(attempt)}: {cause}", transient=True
                    ) from err
                wait, reason = _backoff(attempt), f"could not connect: {cause}"
            except openai.OpenAIError as err:
                raise LLMError(f"LLM call to {config.endpoint} failed: {apply(str(err))}") from err
            else:
                return _reply_from_body(body, config, apply)
            if on_wait is not None:
                on_wait(wait, attempt + 1, reason)
            time.sleep(wait)
            attempt += 1


def _attempts(attempt: int, word: str = "") -> str:
    """" (3 attempts)" or " after 3 attempts" for a turn that tried more than once; "" for
    one request (the agent's steps send one each and count their tries themselves)."""
    if attempt == 0:
        return ""
    return f" {word} {attempt + 1} attempts" if word else f" ({attempt + 1} attempts)"


def _backoff(attempt: int) -> float:
    return _BACKOFF_BASE * 2.0**attempt


def _wait_after_status(
    err: openai.APIStatusError,
    config: LLMConfig,
    apply: Callable[[str], str],
    *,
    attempt: int,
    final: bool,
) -> float:
    """Seconds to sleep before the next attempt, or raise when this answer ends the turn."""
    status = err.status_code
    retry_after = _retry_after(err.response.headers)
    excerpt = apply(_excerpt(err.response.content))
    said = f"LLM endpoint {config.endpoint} answered {status}"
    if status == 429:
        if retry_after is None or retry_after > config.max_inline_wait or final:
            wait = DEFAULT_RETRY_LATER if retry_after is None else retry_after
            raise LLMRetryLater(
                f"{said} (rate limited; retry in {wait:g} s): {excerpt}",
                retry_after=wait,
                status_code=status,
            )
        return retry_after
    if status >= 500:
        if retry_after is not None and retry_after > config.max_inline_wait:
            raise LLMRetryLater(
                f"{said} (retry in {retry_after:g} s): {excerpt}",
                retry_after=retry_after,
                status_code=status,
            )
        if final:
            raise LLMError(f"{said}{_attempts(attempt, 'after')}: {excerpt}",
                           status_code=status, transient=True)
        return max(_backoff(attempt), retry_after or 0.0)
    raise LLMError(f"{said}: {excerpt}", status_code=status)


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds from ``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date); None when
    absent or unusable. A date in the past means 0."""
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / divisor
        except ValueError:
            parsed = email.utils.parsedate_tz(value) if divisor == 1.0 else None
            if parsed is None:
                continue
            seconds = email.utils.mktime_tz(parsed) - time.time()
        if math.isfinite(seconds):
            return max(seconds, 0.0)
    return None


def _excerpt(content: bytes) -> str:
    text = content[: _BODY_EXCERPT * 4].decode("utf-8", errors="replace")
    text = " ".join(text.split())
    return (text[:_BODY_EXCERPT] + "...") if len(text) > _BODY_EXCERPT else (text or "(empty body)")


# --- parsing the answer --------------------------------------------------------------------


def _reply_from_body(content: bytes, config: LLMConfig, apply: Callable[[str], str]) -> LLMReply:
    """Validate the shape ourselves: the client's own parser is lenient (it returns a ``str``
    for a non-JSON content type and builds models without validation)."""

    def malformed(why: str) -> LLMMalformed:
        return LLMMalformed(
            f"LLM endpoint {config.endpoint} answered 200 but {why}: {apply(_excerpt(content))}",
            status_code=200,
        )

    try:
        data = json.loads(content)
    except (ValueError, UnicodeDecodeError):
        raise malformed("the body is not valid JSON") from None
    if not isinstance(data, dict):
        raise malformed("the body is not a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise malformed("it has no choices")
    message = choices[0].get("message")
    if not isinstance(message, dict):
        raise malformed("its first choice has no message")
    text = message.get("content")
    reasoning = next((value for key in ("reasoning_content", "reasoning")
                      if isinstance(value := message.get(key), str) and value.strip()), None)
    finish_reason = choices[0].get("finish_reason")
    if not isinstance(text, str | None) or not isinstance(finish_reason, str | None):
        raise malformed("its message content or finish_reason is not a string")
    try:
        tool_calls = _tool_calls(message.get("tool_calls"))
    except ValueError as err:
        raise malformed(str(err)) from None
    prompt_tokens, completion_tokens = _usage(data.get("usage"))
    cost = (
        prompt_tokens * config.price_in_per_mtok + completion_tokens * config.price_out_per_mtok
    ) / 1_000_000
    return LLMReply(
        content=text,
        tool_calls=tool_calls,
        finish_reason=finish_reason,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        cost_usd=cost,
        reasoning=apply(reasoning) if reasoning else None,
    )


def _tool_calls(raw: object) -> tuple[ToolCall, ...]:
    """Tool calls as sent. Lenient where compatible servers differ and nothing is lost: a
    missing id gets ``call_<index>`` (older llama.cpp), arguments sent as a JSON object are
    serialised back to text, missing arguments are ``""`` (the tools layer rejects them)."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError("its tool_calls is not a list")
    calls = []
    for index, item in enumerate(raw):
        function = item.get("function") if isinstance(item, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(f"its tool call #{index} has no function name")
        arguments = function.get("arguments")
        if isinstance(arguments, dict | list):
            arguments = json.dumps(arguments)
        elif arguments is None:
            arguments = ""
        elif not isinstance(arguments, str):
            raise ValueError(f"its tool call #{index} has arguments that are not text")
        call_id = item.get("id")
        calls.append(
            ToolCall(
                id=call_id if isinstance(call_id, str) and call_id else f"call_{index}",
                name=function["name"],
                arguments=arguments,
            )
        )
    return tuple(calls)


def _usage(raw: object) -> tuple[int, int]:
    """Prompt and completion tokens as reported; 0 for anything absent or not a count."""
    if not isinstance(raw, dict):
        return 0, 0

    def count(key: str) -> int:
        value = raw.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0

    return count("prompt_tokens"), count("completion_tokens")
