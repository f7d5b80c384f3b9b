"""Which repository URLs a target may name: the policy an admin sets, checked before git runs.

A target's URL is handed to the server's own git, so it is a request the server makes on a
user's behalf. Measured before this policy: an engineer of target A read target B's code by
naming the service's bare copy of B (a path under the data folder) as a new target's URL; the
service's own checkout was accepted the same way; a link-local address made the server's git
reach it; ``fd::17`` and ``git://127.0.0.1:<port>/x`` held a web thread for 60 s or more.

Contracts:

* :func:`repo_url_check` raises :class:`RepoUrlRefused`, whose message is one sentence for the
  person who typed the URL, or returns None. It runs no git; it resolves host names (the
  addresses are checked, not the name).
* Remote helpers (``ext::``, ``fd::``, any ``<helper>::``) and option-like URLs are always
  refused; so are control characters.
* A local path (``/path`` or ``file://``) must resolve, symlinks followed, inside one of
  ``local_roots``, and never inside ``protected`` (the data folder, the checkout). A root that
  is a protected folder or one of its parents is ignored: it would let the rule be bypassed.
  ``trusted_roots`` are folders service code (a command, a bench) names for its own repositories:
  they are allowed even inside a protected folder, and no form can name one.
* Redirects are not followed by any git call (``infraops/gitops.py``), so the address checked
  here is the one git reaches, short of a name that resolves differently a moment later.

Nothing here imports Django: ``infraops.services.targets.repo_url_policy`` builds the policy
from the settings.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

DEFAULT_SCHEMES = ("https", "ssh")
KNOWN_SCHEMES = frozenset({"https", "http", "ssh", "git"})

# `host:path` with no "/" before the colon is git's scp-like ssh syntax; `C:` is not a host.
_SCP_LIKE = re.compile(r"(?:(?P<user>[^@/:]+)@)?(?P<host>\[[^\]]+\]|[^/:\[\]]{2,}):(?P<path>.*)")
_HELPER = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*::")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

Resolver = Callable[[str], list[str]]


class RepoUrlRefused(ValueError):
    """The URL is outside the policy; str(error) is a sentence fit for the user."""


@dataclass(frozen=True)
class RepoUrlPolicy:
    """What an admin allows (INFRAOPS_REPO_* settings, docs/deploy.md)."""

    schemes: frozenset[str] = frozenset(DEFAULT_SCHEMES)
    # Host names (exact) or domains (".example.com": it and its subdomains); empty: any host.
    hosts: tuple[str, ...] = ()
    local_roots: tuple[Path, ...] = ()
    protected: tuple[Path, ...] = ()
    private_addresses: bool = False
    trusted_roots: tuple[Path, ...] = ()


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def resolve_host(host: str) -> list[str]:
    """Every address `host` resolves to (the system resolver: /etc/hosts, then DNS)."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (OSError, UnicodeError):
        return []
    return sorted({str(info[4][0]) for info in infos})


def _check_local(raw: str, path_text: str, policy: RepoUrlPolicy) -> None:
    if not policy.local_roots and not policy.trusted_roots:
        raise RepoUrlRefused(f"{raw!r} is a local path; this installation allows only "
                             f"{_scheme_list(policy)} URLs.")
    if not path_text.startswith("/"):
        raise RepoUrlRefused(f"{raw!r} is a relative path; name the repository by an absolute "
                             "path or a URL.")
    path = Path(path_text).resolve()
    if any(_inside(path, Path(root).resolve()) for root in policy.trusted_roots):
        return
    protected = [Path(folder).resolve() for folder in policy.protected]
    if any(_inside(path, folder) for folder in protected):
        raise RepoUrlRefused(f"{raw!r} is inside the service's own data folder or checkout, "
                             "which no target may name.")
    roots = [Path(root).resolve() for root in policy.local_roots]
    usable = [root for root in roots if not any(_inside(folder, root) for folder in protected)]
    if not any(_inside(path, root) for root in usable):
        allowed = ", ".join(str(root) for root in usable) or "none"
        raise RepoUrlRefused(f"{raw!r} is not inside a folder this installation allows local "
                             f"repositories from (INFRAOPS_REPO_LOCAL_ROOTS: {allowed}).")


def _scheme_list(policy: RepoUrlPolicy) -> str:
    return ", ".join(sorted(policy.schemes & KNOWN_SCHEMES)) or "no remote"


def _host_allowed(host: str, policy: RepoUrlPolicy) -> bool:
    if not policy.hosts:
        return True
    return any(host == allowed or (allowed.startswith(".") and
                                   (host.endswith(allowed) or host == allowed[1:]))
               for allowed in policy.hosts)


def _check_host(raw: str, host: str, policy: RepoUrlPolicy, resolver: Resolver) -> None:
    host = host.strip("[]").lower().rstrip(".")
    if not host or host.startswith("-"):
        raise RepoUrlRefused(f"{raw!r} names no usable host.")
    if not _host_allowed(host, policy):
        raise RepoUrlRefused(f"{raw!r}: the host {host!r} is not one this installation allows "
                             f"(INFRAOPS_REPO_HOSTS: {', '.join(policy.hosts)}).")
    if policy.private_addresses:
        return
    addresses = resolver(host)
    if not addresses:
        raise RepoUrlRefused(f"{raw!r}: the host {host!r} cannot be resolved.")
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if not ip.is_global or ip.is_multicast:
            raise RepoUrlRefused(
                f"{raw!r}: the host {host!r} is at {address}, a loopback, link-local, private "
                "or reserved address, which this installation does not let git reach "
                "(INFRAOPS_REPO_PRIVATE_ADDRESSES).")


def _check_scheme(raw: str, scheme: str, policy: RepoUrlPolicy) -> None:
    if scheme not in policy.schemes or scheme not in KNOWN_SCHEMES:
        raise RepoUrlRefused(f"{raw!r}: {scheme}:// URLs are not allowed here; use "
                             f"{_scheme_list(policy)}.")


def repo_url_check(url: str, policy: RepoUrlPolicy, *,
                   resolver: Resolver = resolve_host) -> None:
    """Raise RepoUrlRefused unless git may be pointed at `url` under `policy`."""
    raw = url
    if not url.strip():
        raise RepoUrlRefused("The repository URL is empty.")
    if _CONTROL.search(url) or url != url.strip():
        raise RepoUrlRefused(f"{raw!r} contains spaces or control characters at its ends or "
                             "control characters inside.")
    if url.startswith("-"):
        raise RepoUrlRefused(f"{raw!r} begins with '-', which git would read as an option.")
    if _HELPER.match(url):
        raise RepoUrlRefused(f"{raw!r} names a git remote helper ({url.split('::')[0]}::, "
                             "such as ext:: or fd::), which runs or reaches what no target "
                             "should; use a URL.")
    if url.startswith("/"):
        _check_local(raw, url, policy)
        return
    if "://" in url:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme == "file":
            if parts.netloc not in ("", "localhost"):
                raise RepoUrlRefused(f"{raw!r}: a file:// URL names no host.")
            _check_local(raw, unquote(parts.path), policy)
            return
        _check_scheme(raw, scheme, policy)
        try:
            host = parts.hostname or ""
        except ValueError:
            host = ""
        _check_host(raw, host, policy, resolver)
        return
    scp = _SCP_LIKE.fullmatch(url)
    if scp is None:
        raise RepoUrlRefused(f"{raw!r} is neither a URL (https://..., ssh://...) nor an "
                             "absolute path.")
    _check_scheme(raw, "ssh", policy)
    _check_host(raw, scp.group("host"), policy, resolver)

