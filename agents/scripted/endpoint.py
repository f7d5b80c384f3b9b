"""A real local HTTP server speaking the OpenAI Chat Completions API, for tests.

Script the answers, point the code under test at ``stub.base_url``, then look at what arrived::

    with OpenAIStub([completion(tool_calls=[("read_file", '{"path": "a.py"}')]),
                     rate_limited(0.2),
                     completion("done", usage=(120, 8))]) as stub:
        ...  # chat(LLMConfig(base_url=stub.base_url, api_key="k", model="m"), ...)
        assert stub.requests[0].body["messages"][0]["role"] == "system"
        assert stub.remaining == 0

Each ``POST /v1/chat/completions`` takes the next scripted :class:`StubReply` in arrival order
(more can be added with :meth:`OpenAIStub.push` while it runs). When none is left it answers
500 with ``"OpenAIStub: no scripted reply left ..."`` in the error message. Other paths get 404
and consume nothing. The server runs in daemon threads on 127.0.0.1 at a free port, one thread
per connection, so a reply with a ``delay`` does not hold up the requests that follow it.

A scripted reply can also be a function of the request, ``(ReceivedRequest) -> StubReply``,
called when the request that takes it arrives (in the server's thread, outside the stub's
lock: it may read ``stub.requests`` or ``push`` more). That makes a scripted *agent* possible,
one that reads what the model was sent (``request.body["messages"]``: the last tool results,
the feedback news) and decides its next call from it::

    def next_call(request: ReceivedRequest) -> StubReply:
        last = request.body["messages"][-1]["content"]
        return completion(tool_calls=[("read_file", json.dumps({"path": parse(last)}))])

    stub.push(next_call)

A function that raises is answered 500 with ``"OpenAIStub: the reply function raised ..."``
and its traceback is kept in :attr:`OpenAIStub.errors` (assert it is empty: the code under
test may well retry a 500 and hide the failure).

``StubReply(drop=True)`` (or :func:`dropped`) answers nothing: the stub closes the connection
as soon as the request is read (after ``delay``), so the client sees a connection error, as
from a proxy that resets it or a server that dies mid-request.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import threading
import traceback
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

CHAT_PATH = "/v1/chat/completions"

_call_ids = itertools.count(1)


@dataclass(frozen=True)
class StubReply:
    """One scripted answer. A dict body is sent as JSON; str and bytes are sent as they are
    (Content-Type application/json unless ``headers`` says otherwise). ``delay`` seconds pass
    before the answer is written (for timeout tests; cut short when the stub closes).
    ``drop``: write no answer at all and close the connection (a connection error for the
    client); status, body and headers are then ignored."""

    status: int = 200
    body: dict[str, Any] | str | bytes = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drop: bool = False


@dataclass(frozen=True)
class ReceivedRequest:
    """One request as it arrived: ``headers`` with lower-case names, ``raw`` the exact body
    bytes, ``body`` those bytes parsed as JSON (None when they were not JSON)."""

    method: str
    path: str
    headers: dict[str, str]
    raw: bytes
    body: Any


Responder = Callable[[ReceivedRequest], StubReply]
"""A scripted reply decided when its request arrives."""


def completion(
    content: str | None = None,
    tool_calls: Sequence[tuple[str, str]] = (),
    usage: tuple[int, int] | None = (0, 0),
    *,
    finish_reason: str | None = None,
    model: str = "stub-model",
    reasoning: str | None = None,
) -> StubReply:
    """A valid Chat Completions answer: ``content`` and/or ``tool_calls`` as ``(name,
    arguments_json)`` pairs (ids ``call_1``, ``call_2``, ... unique within the test process;
    read them back from ``reply.body``). ``usage`` is ``(prompt_tokens, completion_tokens)``,
    None to leave the usage object out. ``finish_reason`` defaults to ``"tool_calls"`` when
    there are tool calls, else ``"stop"``. ``reasoning`` is sent as ``reasoning_content``,
    as DeepSeek, vLLM and SGLang send a reasoning model's thinking."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": f"call_{next(_call_ids)}",
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            for name, arguments in tool_calls
        ]
    body: dict[str, Any] = {
        "id": f"chatcmpl-stub{next(_call_ids)}",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason or ("tool_calls" if tool_calls else "stop"),
            }
        ],
    }
    if usage is not None:
        body["usage"] = {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": usage[0] + usage[1],
        }
    return StubReply(body=body)


def _error_body(message: str, kind: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def rate_limited(retry_after: float | None) -> StubReply:
    """429 with ``Retry-After: <seconds>`` (an integer when it is one), or no header for None."""
    headers = {}
    if retry_after is not None:
        headers["Retry-After"] = (
            str(int(retry_after)) if float(retry_after).is_integer() else str(retry_after)
        )
    return StubReply(429, _error_body("Rate limit reached (stub)", "rate_limit_error"), headers)


def server_error(status: int = 500) -> StubReply:
    return StubReply(status, _error_body("The server had an error (stub)", "server_error"))


def malformed() -> StubReply:
    """200 with a body that is not valid JSON (a completion cut off mid-way)."""
    return StubReply(200, b'{"id": "chatcmpl-broken", "object": "chat.completion", "choices": [')


def dropped(delay: float = 0.0) -> StubReply:
    """No answer: the connection is closed once the request is read (after ``delay``)."""
    return StubReply(drop=True, delay=delay)


class OpenAIStub:
    """The server; a context manager (or :meth:`start` / :meth:`close`)."""

    def __init__(self, replies: Iterable[StubReply | Responder] = (), *, port: int = 0,
                 fallback: Responder | None = None) -> None:
        """`port` 0 takes a free one; `fallback` answers every request once the scripted
        replies are used up (a long-running endpoint, such as the demo's model)."""
        self._replies: deque[StubReply | Responder] = deque(replies)
        self._fallback = fallback
        self._requests: list[ReceivedRequest] = []
        self._errors: list[str] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler_for(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    @property
    def requests(self) -> list[ReceivedRequest]:
        """Every request received so far, in arrival order (a copy)."""
        with self._lock:
            return list(self._requests)

    @property
    def remaining(self) -> int:
        """Scripted replies not yet used."""
        with self._lock:
            return len(self._replies)

    @property
    def errors(self) -> list[str]:
        """The tracebacks of reply functions that raised, in order (a copy)."""
        with self._lock:
            return list(self._errors)

    def push(self, reply: StubReply | Responder) -> None:
        """Script one more reply: a :class:`StubReply`, or a function of the request that
        takes it (see the module docstring)."""
        with self._lock:
            self._replies.append(reply)

    def start(self) -> OpenAIStub:
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        if self._thread is not None:  # shutdown() waits for a serve_forever that must be running
            self._server.shutdown()
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> OpenAIStub:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _take(self, request: ReceivedRequest) -> StubReply:
        with self._lock:
            self._requests.append(request)
            number = len(self._requests)
            scripted = self._replies.popleft() if self._replies else self._fallback
        if scripted is None:
            message = f"OpenAIStub: no scripted reply left for request #{number} ({request.path})"
            return StubReply(500, _error_body(message, "stub_exhausted"))
        if isinstance(scripted, StubReply):
            return scripted
        try:  # outside the lock: the function may read stub.requests or push more
            reply = scripted(request)
            if not isinstance(reply, StubReply):
                raise TypeError(f"a reply function returned {type(reply).__name__}, "
                                "not a StubReply")
        except Exception as exc:  # kept for the test, answered as a 500
            with self._lock:
                self._errors.append(f"request #{number}: {traceback.format_exc()}")
            message = (f"OpenAIStub: the reply function raised for request #{number}: "
                       f"{type(exc).__name__}: {exc}")
            return StubReply(500, _error_body(message[:2000], "stub_reply_error"))
        return reply


def _handler_for(stub: OpenAIStub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive like a real endpoint; every answer has a length

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            request = ReceivedRequest(
                method="POST",
                path=self.path,
                headers={name.lower(): value for name, value in self.headers.items()},
                raw=raw,
                body=body,
            )
            if self.path.split("?")[0] != CHAT_PATH:
                with stub._lock:
                    stub._requests.append(request)
                self._answer(
                    StubReply(404, _error_body(f"OpenAIStub: no route {self.path}", "not_found"))
                )
                return
            reply = stub._take(request)
            if reply.delay > 0 and stub._closing.wait(reply.delay):
                self.close_connection = True
                return
            if reply.drop:
                self._drop()
                return
            self._answer(reply)

        def _drop(self) -> None:
            """Close the connection without a byte of answer."""
            self.close_connection = True
            with contextlib.suppress(OSError):  # the client may be gone already
                self.connection.shutdown(socket.SHUT_RDWR)

        def _answer(self, reply: StubReply) -> None:
            if isinstance(reply.body, dict):
                payload = json.dumps(reply.body).encode()
            elif isinstance(reply.body, str):
                payload = reply.body.encode()
            else:
                payload = reply.body
            headers = {"Content-Type": "application/json", **reply.headers}
            try:
                self.send_response(reply.status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test); nothing to answer

        def log_message(self, format: str, *args: Any) -> None:
            pass  # keep test output quiet; stub.requests is the record

    return Handler
