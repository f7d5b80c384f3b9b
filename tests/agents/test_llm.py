"""agents/llm.py against a real local OpenAI-compatible server (agents/scripted/endpoint.py)."""

from __future__ import annotations

import base64
import contextlib
import copy
import json
import re
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from agents.llm import (
    REDACTED,
    LLMConfig,
    LLMError,
    LLMMalformed,
    LLMReply,
    LLMRetryLater,
    chat,
    redact,
    redact_messages,
)
from agents.scripted.endpoint import (
    OpenAIStub,
    StubReply,
    completion,
    malformed,
    rate_limited,
    server_error,
)

API_KEY = "sk-test-A1b2C3d4E5f6G7h8I9j0K1l2M3n4"
DB_PASSWORD = "pg-Pa55w0rd!xyz"
DATABASE_URL = f"postgres://infraops:{DB_PASSWORD}@db.internal:5432/infraops"

HELLO = [{"role": "user", "content": "Say hello."}]
READ_FILE_TOOL = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a range of lines of a file in the worktree.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string"}, "start": {"type": "integer"}},
            "required": ["path"],
        },
    },
}


def config_for(stub: OpenAIStub, **overrides: Any) -> LLMConfig:
    values: dict[str, Any] = {"base_url": stub.base_url, "api_key": API_KEY, "model": "glm-test"}
    return LLMConfig(**(values | overrides))


def test_a_plain_completion_comes_back_as_content() -> None:
    with OpenAIStub([completion("Hello.")]) as stub:
        reply = chat(config_for(stub), HELLO, [])

    assert reply.content == "Hello."
    assert reply.tool_calls == ()
    assert reply.finish_reason == "stop"
    [request] = stub.requests
    assert request.path == "/v1/chat/completions"
    assert request.body["model"] == "glm-test"
    assert request.body["messages"] == HELLO
    assert "tools" not in request.body  # endpoints reject an empty tools list
    assert "tool_choice" not in request.body


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_a_reasoning_model_s_thinking_comes_back_beside_the_content(field: str) -> None:
    answer = completion("Hello.")
    assert isinstance(answer.body, dict)
    answer.body["choices"][0]["message"][field] = f"The user greets; {API_KEY} is no answer."
    with OpenAIStub([answer]) as stub:
        reply = chat(config_for(stub), HELLO, [])

    assert reply.content == "Hello."
    assert reply.reasoning == "The user greets; [REDACTED] is no answer."


def test_tools_are_offered_with_tool_choice_auto() -> None:
    with OpenAIStub([completion("ok")]) as stub:
        chat(config_for(stub), HELLO, [READ_FILE_TOOL])

    [request] = stub.requests
    assert request.body["tools"] == [READ_FILE_TOOL]
    assert request.body["tool_choice"] == "auto"


def test_tool_calls_come_back_with_ids_names_and_raw_arguments() -> None:
    odd_arguments = '{"path": "serve/batch.py",  "start": 10}'  # spacing kept as sent
    broken_arguments = '{"path": '  # not JSON: passed through for the tools layer to refuse
    scripted = completion(
        "Reading two files.", [("read_file", odd_arguments), ("read_file", broken_arguments)]
    )
    assert isinstance(scripted.body, dict)
    sent_ids = [call["id"] for call in scripted.body["choices"][0]["message"]["tool_calls"]]
    with OpenAIStub([scripted]) as stub:
        reply = chat(config_for(stub), HELLO, [READ_FILE_TOOL])

    assert reply.content == "Reading two files."
    assert reply.finish_reason == "tool_calls"
    assert [(call.id, call.name, call.arguments) for call in reply.tool_calls] == [
        (sent_ids[0], "read_file", odd_arguments),
        (sent_ids[1], "read_file", broken_arguments),
    ]
    assert sent_ids[0] != sent_ids[1]


def test_usage_and_cost_are_accounted_from_the_reported_usage() -> None:
    with OpenAIStub([completion("a", usage=(1_200, 300)), completion("b", usage=None)]) as stub:
        cfg = config_for(stub, price_in_per_mtok=0.6, price_out_per_mtok=2.2)
        reported = chat(cfg, HELLO, [])
        absent = chat(cfg, HELLO, [])

    assert (reported.prompt_tokens, reported.completion_tokens) == (1_200, 300)
    assert reported.cost_usd == pytest.approx(1_200 * 0.6e-6 + 300 * 2.2e-6)
    assert (absent.prompt_tokens, absent.completion_tokens, absent.cost_usd) == (0, 0, 0.0)


def test_a_short_retry_after_is_waited_in_place_and_retried() -> None:
    with OpenAIStub([rate_limited(0.2), completion("after the wait")]) as stub:
        started = time.monotonic()
        reply = chat(config_for(stub), HELLO, [])
        elapsed = time.monotonic() - started

    assert reply.content == "after the wait"
    assert elapsed >= 0.2
    assert len(stub.requests) == 2


def test_a_long_retry_after_asks_the_caller_to_retry_later_after_one_request(
        monkeypatch: pytest.MonkeyPatch) -> None:
    caller, slept, sleep = threading.current_thread(), [], time.sleep

    def recorded(seconds: float) -> None:
        if threading.current_thread() is caller:
            slept.append(seconds)
        sleep(seconds)

    monkeypatch.setattr(time, "sleep", recorded)
    with (OpenAIStub([rate_limited(120), completion("never fetched")]) as stub,
          pytest.raises(LLMRetryLater) as raised):
        chat(config_for(stub), HELLO, [])

    assert raised.value.retry_after == 120
    assert raised.value.status_code == 429
    assert len(stub.requests) == 1
    assert slept == []  # it did not sleep: the caller re-schedules


def test_a_rate_limit_without_retry_after_asks_to_retry_in_30_seconds() -> None:
    with OpenAIStub([rate_limited(None)]) as stub, pytest.raises(LLMRetryLater) as raised:
        chat(config_for(stub), HELLO, [])

    assert raised.value.retry_after == 30
    assert len(stub.requests) == 1


def test_short_rate_limits_count_toward_max_retries() -> None:
    stub = OpenAIStub([rate_limited(0.1)] * 3 + [completion("too late")])
    with stub, pytest.raises(LLMRetryLater) as raised:
        chat(config_for(stub, max_retries=2), HELLO, [])

    assert len(stub.requests) == 3
    assert raised.value.retry_after == pytest.approx(0.1)


def test_two_server_errors_then_success_take_three_requests() -> None:
    with OpenAIStub([server_error(), server_error(502), completion("third time")]) as stub:
        started = time.monotonic()
        reply = chat(config_for(stub, max_retries=2), HELLO, [])
        elapsed = time.monotonic() - started

    assert reply.content == "third time"
    assert len(stub.requests) == 3
    assert elapsed >= 0.5 + 1.0  # exponential backoff between the attempts


def test_three_server_errors_raise_an_error_naming_the_status() -> None:
    stub = OpenAIStub([server_error()] * 3 + [completion("never fetched")])
    with stub, pytest.raises(LLMError) as raised:
        chat(config_for(stub, max_retries=2), HELLO, [])

    assert not isinstance(raised.value, LLMRetryLater)
    assert raised.value.status_code == 500
    message = str(raised.value)
    assert "500" in message
    assert f"{stub.base_url}/chat/completions" in message
    assert "The server had an error (stub)" in message
    assert len(stub.requests) == 3


def test_a_bad_request_fails_at_once() -> None:
    bad = StubReply(
        400, {"error": {"message": "Invalid 'messages[0].role'", "type": "invalid_request_error"}}
    )
    with OpenAIStub([bad, completion("never fetched")]) as stub, pytest.raises(LLMError) as raised:
        chat(config_for(stub), HELLO, [])

    assert raised.value.status_code == 400
    assert "400" in str(raised.value)
    assert "Invalid 'messages[0].role'" in str(raised.value)
    assert len(stub.requests) == 1


def test_an_error_body_echoing_the_key_is_redacted_in_the_message() -> None:
    echo = StubReply(401, {"error": {"message": f"Incorrect API key provided: {API_KEY}"}})
    with OpenAIStub([echo]) as stub, pytest.raises(LLMError) as raised:
        chat(config_for(stub), HELLO, [])

    assert API_KEY not in str(raised.value)
    assert REDACTED in str(raised.value)


def test_malformed_json_raises_llm_malformed() -> None:
    with OpenAIStub([malformed()]) as stub, pytest.raises(LLMMalformed) as raised:
        chat(config_for(stub), HELLO, [])

    assert "not valid JSON" in str(raised.value)
    assert len(stub.requests) == 1


@pytest.mark.parametrize(
    "body",
    [
        {"id": "chatcmpl-x", "object": "chat.completion"},
        {"choices": []},
        {"choices": [{"index": 0}]},
        {"choices": [{"message": {"content": None, "tool_calls": [{"id": "c", "function": {}}]}}]},
        "<html>502 Bad Gateway</html>",
    ],
    ids=["no-choices", "empty-choices", "no-message", "nameless-tool-call", "html"],
)
def test_a_200_that_is_not_a_chat_completion_raises_llm_malformed(
    body: dict[str, Any] | str,
) -> None:
    with OpenAIStub([StubReply(200, body)]) as stub, pytest.raises(LLMMalformed):
        chat(config_for(stub), HELLO, [])


def _arguments_cpu(lines: int) -> float:
    """The CPU time of a turn whose answer carries one tool call of that many lines of
    arguments (the stub server's share included), checked to arrive intact."""
    huge = json.dumps({"path": "a.py", "new": "0123456789abcdéf\n" * lines})
    with OpenAIStub([completion(tool_calls=[("edit_file", huge)])]) as stub:
        started = time.process_time()
        reply = chat(config_for(stub), HELLO, [])
        spent = time.process_time() - started
    [call] = reply.tool_calls
    assert call.arguments == huge
    return spent


def test_a_10_mb_arguments_string_arrives_intact_and_fast() -> None:
    assert len(json.dumps({"new": "0123456789abcdéf\n" * 620_000})) > 10_000_000
    # Linear in the answer's size: ten times the arguments cost about ten times the CPU, HTTP
    # transfer included (CPU, not the wall clock: the suite runs on a loaded machine).
    ratio = _arguments_cpu(620_000) / max(_arguments_cpu(62_000), 1e-3)
    assert ratio < 30, ratio


def _edit_call(lines: int) -> list[dict[str, Any]]:
    arguments = json.dumps({"new": "x = compute(y)\n" * lines})
    return [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "edit_file", "arguments": arguments}}]}]


def _redaction_cpu(history: list[dict[str, Any]]) -> float:
    """The least CPU time of three redactions (CPU, not the wall clock: the suite runs on a
    loaded machine), each checked lossless."""
    spent = []
    for _ in range(3):
        started = time.process_time()
        redacted = redact_messages(history, [DB_PASSWORD, API_KEY])
        spent.append(time.process_time() - started)
        assert redacted == history
    return min(spent)


def test_redacting_a_10_mb_tool_call_for_the_next_turn_is_fast_and_lossless() -> None:
    # Linear in the text: ten times the text costs about ten times the CPU (a scan that
    # restarted per match or per secret would cost a hundred). Compared on this machine, at
    # this moment, rather than against a bound in seconds.
    small, large = _edit_call(70_000), _edit_call(700_000)  # 1 MB and 10 MB of arguments
    assert len(large[0]["tool_calls"][0]["function"]["arguments"]) > 10_000_000
    ratio = _redaction_cpu(large) / max(_redaction_cpu(small), 1e-4)
    assert ratio < 30, ratio


def test_secrets_never_reach_a_request_body() -> None:
    planted_arguments = json.dumps({"env": {"DATABASE_URL": DATABASE_URL}, "key": API_KEY})
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You tune inference servers."},
        {"role": "user", "content": f"OPENAI_API_KEY={API_KEY} DATABASE_URL={DATABASE_URL}"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "run_experiment", "arguments": planted_arguments},
                },
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_a",
            "content": f"probe: auth failed for {DB_PASSWORD}; Authorization: Bearer {API_KEY}",
        },
    ]
    tools = [
        {
            "type": "function",
            "function": {
                "name": "run_experiment",
                "description": f"never pass {DB_PASSWORD}",
                "parameters": {"type": "object", "properties": {}},
            },
        }
    ]
    original = copy.deepcopy(messages)
    with OpenAIStub([rate_limited(0.05), completion("ok")]) as stub:
        chat(config_for(stub), messages, tools, secrets=[DB_PASSWORD])

    assert messages == original  # the caller's history is not rewritten
    assert len(stub.requests) == 2  # the retried request is redacted too
    for request in stub.requests:
        for secret in (API_KEY, DB_PASSWORD, "Pa55w0rd"):
            assert secret.encode() not in request.raw
        assert REDACTED.encode() in request.raw
        sent = request.body["messages"]
        assert [message["role"] for message in sent] == ["system", "user", "assistant", "tool"]
        assert sent[3]["tool_call_id"] == "call_a"
        assert json.loads(sent[2]["tool_calls"][0]["function"]["arguments"]) == {
            "env": {"DATABASE_URL": f"postgres://infraops:{REDACTED}@db.internal:5432/infraops"},
            "key": REDACTED,
        }


def test_the_authorization_header_carries_the_key() -> None:
    with OpenAIStub([completion("ok")]) as stub:
        chat(config_for(stub), HELLO, [])

    [request] = stub.requests
    assert request.headers["authorization"] == f"Bearer {API_KEY}"


def test_a_reply_slower_than_the_timeout_fails_within_the_retry_budget() -> None:
    slow = StubReply(body=completion("too late").body, delay=10)
    with OpenAIStub([slow] * 3) as stub:
        started = time.monotonic()
        with pytest.raises(LLMError) as raised:
            chat(config_for(stub, timeout=0.3, max_retries=2), HELLO, [])
        elapsed = time.monotonic() - started

    budget = 3 * 0.3 + 0.5 + 1.0  # three attempts, two backoffs
    assert budget <= elapsed < budget + 1.5
    assert "did not answer within 0.3 s (3 attempts)" in str(raised.value)
    assert raised.value.status_code is None
    assert len(stub.requests) == 3


class Trickler:
    """A server that answers a byte at a time, each byte well within any per-read timeout:
    after the whole head at once (`head_at_once`), or from the first byte of the head on. It
    would go on for minutes; it stops when the client hangs up."""

    def __init__(self, *, head_at_once: bool, every: float = 0.1) -> None:
        self.head_at_once, self.every = head_at_once, every
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.sent = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.listener.getsockname()[1]}/v1"

    def __enter__(self) -> Trickler:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.listener.close()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            connection, _ = self.listener.accept()
            with connection:
                connection.recv(65536)
                body = json.dumps(completion("late").body).encode()
                head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                        b"X-Padding: " + b"x" * 4000 + b"\r\n"
                        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
                if self.head_at_once:
                    connection.sendall(head)
                    head = b""
                for byte in head + body + b" " * 100_000:
                    connection.sendall(bytes([byte]))
                    self.sent += 1
                    time.sleep(self.every)


def turn_in_a_thread(cfg: LLMConfig) -> BaseException | LLMReply:
    """chat() in a thread of its own, its answer or error: a turn that a trickled answer
    held fails the test after a generous two minutes instead of hanging it."""
    outcome: list[BaseException | LLMReply] = []

    def turn() -> None:
        try:
            outcome.append(chat(cfg, HELLO, []))
        except BaseException as exc:  # handed to the test thread
            outcome.append(exc)

    worker = threading.Thread(target=turn, daemon=True)
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive(), "the trickled answer held the turn"
    [result] = outcome
    return result


@pytest.mark.parametrize("head_at_once", [True, False], ids=["body", "head"])
def test_an_answer_trickled_a_byte_at_a_time_is_cut_off_when_the_request_s_time_is_up(
    head_at_once: bool,
) -> None:
    """Each byte comes within the 1 s timeout, so a per-read timeout never trips; the whole
    answer would take minutes. The turn ends with the timeout's error instead (the thread's
    generous deadline is the test's guard, not a bound on the time)."""
    with Trickler(head_at_once=head_at_once) as server:
        cfg = LLMConfig(base_url=server.base_url, api_key=API_KEY, model="m", timeout=1.0,
                        max_retries=0)
        error = turn_in_a_thread(cfg)
    assert isinstance(error, LLMError) and error.transient
    assert "did not answer within 1 s" in str(error)
    assert 0 < server.sent < 1000  # cut off after some bytes, long before the answer's end


def test_a_proxy_the_environment_names_is_used_and_its_answer_keeps_the_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """HTTP_PROXY names a proxy that trickles its answer: the request goes through it (the
    endpoint's own name does not resolve, so no answer could come any other way) and is cut
    off when the request's time is up, as without a proxy."""
    with Trickler(head_at_once=True) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.base_url.removesuffix("/v1"))
        cfg = LLMConfig(base_url="http://model.invalid/v1", api_key=API_KEY, model="m",
                        timeout=1.0, max_retries=0)
        error = turn_in_a_thread(cfg)

    assert isinstance(error, LLMError) and "did not answer within 1 s" in str(error)
    assert proxy.sent > 0


def test_an_unreachable_endpoint_raises_llm_error() -> None:
    with socket.socket() as sock:  # a port that was free a moment ago: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cfg = LLMConfig(
        base_url=f"http://127.0.0.1:{port}/v1", api_key=API_KEY, model="m", max_retries=0
    )

    with pytest.raises(LLMError, match="could not be reached"):
        chat(cfg, HELLO, [])


# --- redaction as a pure function -------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"key {API_KEY}.", f"key {REDACTED}."),
        ("OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuvwxyz012", f"OPENAI_API_KEY={REDACTED}"),
        ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig", f"Authorization: Bearer {REDACTED}"),
        ("token ghp_" + "a" * 36, f"token {REDACTED}"),
        ("AKIAIOSFODNN7EXAMPLE is an AWS key", f"{REDACTED} is an AWS key"),
        ("redis://:hunter22@cache:6379/0", f"redis://:{REDACTED}@cache:6379/0"),
        (
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----",
            REDACTED,
        ),
        # Look-alikes in ordinary code stay: the agent must be able to read and edit them.
        ("risk-free task-scheduler sk-short", "risk-free task-scheduler sk-short"),
        (
            "http://localhost:8000/v1 and user@example.com",
            "http://localhost:8000/v1 and user@example.com",
        ),
    ],
)
def test_key_shapes_are_redacted_without_any_secret_given(text: str, expected: str) -> None:
    assert redact(text, []) == expected


def test_literal_secrets_are_redacted_in_every_form_and_short_ones_are_ignored() -> None:
    quoted = 'pa"ss\\w0rd'
    text = f"{quoted} | {json.dumps(quoted)} | {DB_PASSWORD} | pg-Pa55w0rd%21xyz | root"

    assert redact(text, [quoted, DB_PASSWORD, "root"]) == (
        f'{REDACTED} | "{REDACTED}" | {REDACTED} | {REDACTED} | root'
    )


def _decodable(text: str) -> bytes:
    """Every byte string a reader could decode from the runs of base64 characters of
    ``text``, at each of the 4 alignments, joined."""
    found = []
    for piece in re.findall(r"[A-Za-z0-9+/_-]+", text):
        for offset in range(4):
            chunk = piece[offset:]
            chunk = chunk[: len(chunk) // 4 * 4]
            for decode in (base64.b64decode, base64.urlsafe_b64decode):
                with contextlib.suppress(ValueError):
                    found.append(decode(chunk))
    return b"\0".join(found)


@pytest.mark.parametrize("prefix", ["", "a", "ab"], ids=["aligned", "after-1", "after-2"])
@pytest.mark.parametrize("encode", [base64.b64encode, base64.urlsafe_b64encode],
                         ids=["standard", "url-safe"])
def test_a_secret_inside_base64_text_is_redacted_wherever_it_starts(
    prefix: str, encode: Callable[[bytes], bytes]
) -> None:
    secret = "sk-canary-b64-\xff?>0123456789"
    text = "token " + encode(f"{prefix}Authorization: Bearer {secret}\n".encode()).decode()
    middle = secret.encode()[2:-2]
    assert middle in _decodable(text + " end")  # the reader finds it before redaction

    redacted = redact(text + " end", [secret])

    assert middle not in _decodable(redacted)
    assert redacted.startswith("token ") and redacted.endswith(" end")


def test_redact_messages_reaches_every_string_and_leaves_the_input_alone() -> None:
    messages: list[dict[str, Any]] = [
        {
            "role": "assistant",
            "content": None,
            "name": "agent-s3cr3tx",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {
                        "name": "s3cr3tx_tool",
                        "arguments": json.dumps({"v": ["s3cr3tx", 1, True]}),
                    },
                },
            ],
        },
    ]
    original = copy.deepcopy(messages)

    redacted = redact_messages(messages, ["s3cr3tx"])

    assert messages == original
    assert "s3cr3tx" not in json.dumps(redacted)
    call = redacted[0]["tool_calls"][0]
    assert call["function"]["name"] == f"{REDACTED}_tool"
    assert json.loads(call["function"]["arguments"]) == {"v": [REDACTED, 1, True]}
    assert redacted[0]["content"] is None
