"""The live log's sender (infraops/consumers.py) when its client goes away mid-frame."""

from __future__ import annotations

import asyncio
import logging

import pytest
from uvicorn.protocols.utils import ClientDisconnected
from websockets.exceptions import ConnectionClosedOK
from websockets.frames import Close

from infraops.consumers import SequencedLogConsumer


class _GoneClient(SequencedLogConsumer):
    """A socket with one row to send whose client has already gone: `send` raises what the
    server raises then."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error
        self.last_sent, self.fetch_upto, self.requested = 0, 0, None
        self.client_ready = True
        self._allowed_at = float("inf")  # no access re-check: the row goes straight out
        self._wake = asyncio.Event()
        self._wake.set()

    def render_after(self, after: int, limit: int = 50) -> tuple[str, int]:
        return "<p>row</p>", after + 1

    async def send(self, text_data: str | None = None, bytes_data: bytes | None = None,
                   close: bool = False) -> None:
        raise self.error


@pytest.mark.django_db
@pytest.mark.parametrize("error", [
    ClientDisconnected(), ConnectionClosedOK(Close(1001, ""), None), ConnectionResetError(),
], ids=["uvicorn", "websockets", "reset"])
def test_a_client_that_went_away_is_logged_at_info_without_a_traceback(
    caplog: pytest.LogCaptureFixture, error: Exception
) -> None:
    """Issue 28: every client disconnect was logged as an ERROR with a traceback."""
    consumer = _GoneClient(error)

    with caplog.at_level(logging.INFO, logger="infraops.consumers"):
        asyncio.run(consumer._send_loop())

    records = [r for r in caplog.records if r.name == "infraops.consumers"]
    assert [r.levelno for r in records] == [logging.INFO]
    assert records[0].exc_info is None
    assert "went away" in records[0].getMessage()


class _RecordsCloses(_GoneClient):
    closed: list[int]

    async def _close_once(self, code: int) -> None:
        self.closed = [*getattr(self, "closed", []), code]


@pytest.mark.django_db
def test_a_real_fault_while_sending_is_still_an_error_that_closes_the_socket(
    caplog: pytest.LogCaptureFixture,
) -> None:
    consumer = _RecordsCloses(ValueError("a bug"))

    asyncio.run(consumer._send_loop())

    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert errors and errors[0].exc_info is not None
    assert consumer.closed  # with the server-error code: the page reconnects and resumes
