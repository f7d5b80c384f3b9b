"""A full disk, told apart from other failures: an agent run that meets one pauses with the
reason (an engineer frees space, then resumes it) instead of failing for something its change
did not do. The product writes its clones, the runs' worktrees and the experiments' outputs
into the data folder (settings.DATA_DIR), so the reason says how much room is left there."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Final

from django.conf import settings

_FULL_ERRNOS: Final = (errno.ENOSPC, errno.EDQUOT)
# What git and other programs print for those errors (their text is all a GitError keeps).
_FULL_WORDS: Final = ("no space left on device", "disk quota exceeded")


def disk_full_reason(error: BaseException) -> str | None:
    """A sentence for the run's page when error, or an error it was raised from, says that a
    disk is full (an OSError's errno, or the message of a program that met one); else None."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _says_full(current):
            return (f"the disk is full ({_what(current)}); {_room_left()}. Free space on the "
                    "host, then resume the run.")
        current = current.__cause__ or current.__context__
    return None


def says_disk_full(text: str) -> bool:
    """Whether a message (git's, an OSError's, an experiment's failure reason) says that a
    disk is full."""
    lowered = text.lower()
    return any(words in lowered for words in _FULL_WORDS)


def _says_full(error: BaseException) -> bool:
    if isinstance(error, OSError) and error.errno in _FULL_ERRNOS:
        return True
    return says_disk_full(str(error))


def _what(error: BaseException) -> str:
    if isinstance(error, OSError) and error.strerror:
        where = f" writing {error.filename}" if error.filename else ""
        return f"{error.strerror}{where}"
    return " ".join(str(error).split())[:300]


def _room_left() -> str:
    folder = Path(settings.DATA_DIR)
    try:
        free = shutil.disk_usage(folder).free
    except OSError as exc:
        return f"the free space of the data folder {folder} cannot be read: {exc.strerror}"
    return f"{free / (1 << 20):.0f} MB free in the data folder {folder}"
