"""Sandbox containment figures: real attack attempts inside
infraops.experiments.sandbox.sandbox_run.

    .venv/bin/python bench/sandbox.py [--smoke]   (as the worker runs: root; no Django, no database)

Every attempt really tries its operation (a TCP or unix-socket connection, a DNS query, a file
read, a file write) from a small Python program run in the sandbox, and counts as a success only
when the operation worked: for connections and reads the program exits 0 with the marker
``ESCAPED <sha256>`` of what it got, and the sha256 must be that of the real thing on the host
(the canary's contents, the worker's environment variable); for writes the file must have
appeared (or changed) on the host afterwards. The same programs are then run unconfined on the
host, for the attempts that are harmless there, to show that the detection works
(`check: detector-works yes <attempt>`): a broken sandbox would give a non-zero figure.

Prints `figure: <name> <value> <unit>` lines (containment figures add `reason=...`), `attempt:`
and `check:` lines. Exit status 1 when an escape figure is non-zero, a containment figure is 0,
or a detector check that must work on any host did not.

--smoke: every attempt, the detector checks, the containment figures, the timeout's leftovers
and 3 sandbox starts; no host effects (the CPU recovery waits, the 1 GiB flood) and no
isolation runs (abuser beside victim). It shows that the bench runs: a figure that would fail
the full run is said, not judged (exit 0), unless there is no sandbox here at all.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import secrets
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infraops.experiments import sandbox  # noqa: E402
from infraops.experiments.sandbox import cgroups, scratch  # noqa: E402

PYTHON = "/usr/bin/python3"  # inside the sandbox only /usr is there; same program on the host
CANARY_VAR = "INFRAOPS_BENCH_ENV_CANARY"
ATTEMPT_FILE = "attempt.py"
HOST_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
ATTEMPT_LIMITS = sandbox.SandboxLimits(
    wall_seconds=3.0, cpu_seconds=2, address_space_mb=256, file_size_mb=1, processes=32,
    output_bytes=65_536,
)

# Abuses that used to spend what other runs need (one RLIMIT_NPROC for the whole uid; no total
# of memory or disk), each holding its limit until the bench writes `stop` into the folder bound
# read-only at /control (the host's writes into a work tree do not reach a running sandbox).
_HOLD = "while not os.path.exists('/control/stop'): time.sleep(0.05)"
ABUSES: tuple[tuple[str, str, sandbox.SandboxLimits], ...] = (
    ("fork_bomb", f"""
import os, time
said = False
while not os.path.exists("/control/stop"):
    try:
        if os.fork() == 0:
            {_HOLD}
            os._exit(0)
    except OSError:
        if not said:
            print("AT-LIMIT", flush=True)
            said = True
        time.sleep(0.01)
""", sandbox.SandboxLimits(wall_seconds=60.0, processes=32, memory_mb=1024)),
    ("memory_hog", f"""
import os, time
for _ in range(8):
    if os.fork() == 0:
        b = b"x" * (64 << 20)
        {_HOLD}
        os._exit(0)
time.sleep(1.0)
print("AT-LIMIT", flush=True)
{_HOLD}
""", sandbox.SandboxLimits(wall_seconds=60.0, processes=32, memory_mb=256)),
    ("disk_fill", f"""
import os, time
for i in range(40):
    with open("fill-%d" % i, "wb") as f:
        f.write(b"x" * (8 << 20))
print("AT-LIMIT", flush=True)
{_HOLD}
""", sandbox.SandboxLimits(wall_seconds=60.0, file_size_mb=16, disk_mb=64)),
)
# The victim needs 40 processes at once, 16 MB in each and 16 MB of disk: far under its limits.
VICTIM = r"""
import os, sys, time
children = []
for _ in range(40):
    pid = os.fork()
    if pid == 0:
        b = b"x" * (16 << 20)
        time.sleep(0.5)
        os._exit(0)
    children.append(pid)
with open("victim.bin", "wb") as f:
    f.write(b"y" * (16 << 20))
sys.exit(sum(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0 for pid in children))
"""
VICTIM_LIMITS = sandbox.SandboxLimits(wall_seconds=120.0, processes=64, memory_mb=2048,
                                      disk_mb=256, file_size_mb=64)

# Issue 28's attack on the disk limit: empty files, more than a walking meter counted, then big
# writes into the last of them (so that no new file is needed). argv: files, writes, MB each.
# Counts what the kernel took: every os.write's return.
DISK_ATTACK = r"""
import os, sys
files, writes, megabytes = (int(arg) for arg in sys.argv[1:])
made = 0
for i in range(files):
    try:
        os.close(os.open("e%d" % i, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except OSError:
        break
    made += 1
wrote, chunk = 0, b"x" * (1 << 20)
for i in range(min(writes, made)):
    fd = os.open("e%d" % (made - 1 - i), os.O_WRONLY)
    try:
        for _ in range(megabytes):
            wrote += os.write(fd, chunk)
    except OSError:
        pass
    finally:
        os.close(fd)
print("MADE", made, "WROTE", wrote, flush=True)
"""

# The attacker's program. argv: kind, arguments. Prints ESCAPED <sha256 of what it got> and exits
# 0 when the operation worked; prints BLOCKED <error> and exits 3 otherwise.
ATTEMPT = r'''
import glob, hashlib, os, socket, struct, sys

def escaped(data):
    print("ESCAPED", hashlib.sha256(data).hexdigest(), flush=True)
    sys.exit(0)

def dns_query(server, name):
    ident = 0x5EED
    question = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    packet = struct.pack(">HHHHHH", ident, 0x0100, 1, 0, 0, 0) + question + struct.pack(">HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.settimeout(2)
        udp.sendto(packet, (server, 53))
        reply = udp.recv(512)
    if len(reply) < 12 or struct.unpack(">H", reply[:2])[0] != ident:
        raise OSError("not a DNS reply")

kind, args = sys.argv[1], sys.argv[2:]
try:
    if kind == "tcp":
        socket.create_connection((args[0], int(args[1])), timeout=2).close()
        escaped(b"connected")
    elif kind == "unix":
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
            unix.settimeout(2)
            unix.connect(args[0])
        escaped(b"connected")
    elif kind == "dns":
        # Any answer, even "no such name", means a DNS packet left and came back.
        errors = []
        try:
            socket.getaddrinfo(args[0], 443)
            escaped(b"answered")
        except OSError as exc:
            errors.append("getaddrinfo: %s" % exc)
        for server in args[1:]:
            try:
                dns_query(server, args[0])
                escaped(b"answered")
            except OSError as exc:
                errors.append("%s: %s" % (server, exc))
        raise OSError("; ".join(errors))
    elif kind == "read":
        with open(args[0], "rb") as file:
            escaped(file.read())
    elif kind == "environ":
        # args: variable name, then paths (globs allowed). READ lines name what was readable.
        wanted, paths, readable, found, last_error = args[0].encode() + b"=", [], 0, None, None
        for pattern in args[1:]:
            paths += sorted(glob.glob(pattern)) if "*" in pattern else [pattern]
        for path in paths:
            try:
                with open(path, "rb") as file:
                    data = file.read()
            except OSError as exc:
                last_error = exc
                continue
            readable += 1
            if path in args[1:]:
                names = b",".join(v.split(b"=", 1)[0] for v in data.split(b"\0") if v)
                print("READ", path, hashlib.sha256(data).hexdigest(), names.decode(), flush=True)
            for variable in data.split(b"\0"):
                if variable.startswith(wanted):
                    found = variable[len(wanted):]
        print("READABLE %d of %d" % (readable, len(paths)), flush=True)
        if found is not None:
            escaped(found)
        raise last_error or OSError("%s not found" % args[0])
    elif kind == "write":
        # args: token, then paths; tries every path, exits 0 if any was written.
        wrote = []
        for path in args[1:]:
            try:
                with open(path, "a") as file:
                    file.write("\n# " + args[0] + "\ntouch /tmp/pwned-" + args[0] + "\n")
                os.chmod(path, 0o755)
                wrote.append(path)
            except OSError as exc:
                print("BLOCKED", path, type(exc).__name__, exc, flush=True)
        if not wrote:
            sys.exit(3)
        print("WROTE", " ".join(wrote), flush=True)
        escaped(args[0].encode())
    else:
        raise SystemExit("unknown kind " + kind)
except OSError as exc:
    print("BLOCKED", type(exc).__name__, str(exc)[:300], flush=True)
    sys.exit(3)
'''

FORK_BOMB = """
import os, sys, time
made = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        made += 1
except OSError:
    print(made, flush=True)
    raise
"""


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def figure(name: str, value: float | str, unit: str, extra: str = "") -> None:
    print(f"figure: {name} {value} {unit}" + (f" {extra}" if extra else ""), flush=True)


def said(output: bytes, limit: int = 400) -> str:
    """What the program printed, on one line, for the report (no file contents are printed)."""
    text = " | ".join(output.decode("utf-8", "replace").split("\n")).strip(" |")
    return (text[: limit - 3] + "...") if len(text) > limit else text or "(no output)"


@dataclass
class Attempt:
    """One attack. escaped(exit_code, stdout) decides, from the program's marker and/or the host's
    state, whether it got through. host_check: also run it unconfined to show that escaped()
    detects success; required: that check must work on any host the benchmark runs on."""

    group: str
    name: str
    args: list[str]
    escaped: Callable[[int | None, bytes], bool]
    host_check: bool = True
    required: bool = True
    host_skip_reason: str = ""
    host_args: list[str] | None = None  # for the unconfined run, where they differ from args


def marker(expected: bytes) -> Callable[[int | None, bytes], bool]:
    """Succeeded: exit 0 and ESCAPED with the sha256 of the real thing."""
    line = f"ESCAPED {sha(expected)}".encode()

    def escaped(exit_code: int | None, stdout: bytes) -> bool:
        return exit_code == 0 and line in stdout.splitlines()

    return escaped


def host_file(predicate: Callable[[], bool]) -> Callable[[int | None, bytes], bool]:
    """Succeeded: the write shows on the host (a write into the sandbox's own tmpfs does not)."""
    return lambda _code, _stdout: predicate()


def sandbox_uid_processes(uid: int) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["uids", "cmdline", "create_time"]):
        uids = process.info["uids"]
        if uids is not None and uid in (uids.real, uids.effective):
            found.append(process)
    return found


class Watch:
    """Tells this script's sandbox processes from those of other runs of the same uid (a test
    suite or a worker may be running sandboxes at the same time): the command first prints its
    pid namespace, which is then pinned (so its inode is not reused) and its members recorded.
    After the run, a process of the sandbox uid is this run's when it is in that namespace,
    was seen in it (same pid and start time: a zombie reparented out of it), or names the
    run's folder in its command line (bwrap itself, outside the namespace)."""

    PREFIX = "readlink /proc/self/ns/pid; "

    def __init__(self, uid: int, folder: str) -> None:
        self.uid, self.folder = uid, folder
        self.fd: int | None = None
        self.seen: dict[int, float] = {}

    def on_output(self, stream: str, chunk: bytes) -> None:
        if self.fd is not None or stream != "stdout" or not chunk.startswith(b"pid:["):
            return
        inode = int(chunk[5 : chunk.index(b"]")])
        for process in psutil.process_iter(["create_time"]):
            path = f"/proc/{process.pid}/ns/pid"
            try:
                if os.stat(path).st_ino != inode:
                    continue
                self.seen[process.pid] = process.info["create_time"]
                if self.fd is None:
                    self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                continue

    def leftovers(self) -> list[int]:
        if self.fd is None:  # never saw the namespace: every process of the uid counts
            return [int(process.pid) for process in sandbox_uid_processes(self.uid)]
        mine = os.fstat(self.fd)
        found = []
        for process in sandbox_uid_processes(self.uid):
            try:
                ns = os.stat(f"/proc/{process.pid}/ns/pid")
                inside = (ns.st_dev, ns.st_ino) == (mine.st_dev, mine.st_ino)
            except OSError:
                inside = False
            seen = self.seen.get(process.pid) == process.info["create_time"]
            named = any(self.folder in arg for arg in process.info["cmdline"] or ())
            if inside or seen or named:
                found.append(int(process.pid))
        return found

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


class Bench:
    def __init__(self, env_token: str) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="infraops-bench-sandbox-"))
        self.base.chmod(0o755)
        self.identity = sandbox.sandbox_identity()
        self.work, self.out = self.base / "work", self.base / "out"
        self.token = env_token  # the value of CANARY_VAR in this process's environment
        self.cleanup: list[Path] = []
        self.failed = False

    # ------------------------------------------------------------------ running

    def spec(self, command: str, limits: sandbox.SandboxLimits) -> sandbox.SandboxSpec:
        return sandbox.SandboxSpec(command=command, workdir=self.work, out_dir=self.out, env={},
                                   limits=limits)

    def run(self, command: str, limits: sandbox.SandboxLimits = ATTEMPT_LIMITS,
            watch: Watch | None = None) -> sandbox.SandboxResult:
        if watch is None:
            return sandbox.sandbox_run(self.spec(command, limits), identity=self.identity)
        return sandbox.sandbox_run(self.spec(Watch.PREFIX + command, limits),
                                   identity=self.identity, on_output=watch.on_output)

    def watched(self, command: str, limits: sandbox.SandboxLimits = ATTEMPT_LIMITS,
                ) -> tuple[sandbox.SandboxResult, list[int]]:
        """Run command; also return the host pids of the sandbox uid left over from this run."""
        watch = Watch(self.identity.uid, str(self.base))
        try:
            result = self.run(command, limits, watch)
            return result, watch.leftovers()
        finally:
            watch.close()

    def attempt_command(self, attempt: Attempt) -> str:
        return shlex.join([PYTHON, f"/work/{ATTEMPT_FILE}", *attempt.args])

    # ------------------------------------------------------------------ setup

    def prepare(self) -> None:
        for path in (self.work, self.out):
            sandbox.sandbox_prepare_dir(path, self.identity)
        (self.work / ATTEMPT_FILE).write_text(ATTEMPT)
        (self.work / "bomb.py").write_text(FORK_BOMB)
        # A real git worktree: sandbox_run binds its .git read-only. Handed to the sandbox uid,
        # so that only the read-only bind stands between a probe and a planted hook.
        subprocess.run(["git", "-c", "core.hooksPath=/dev/null", "init", "-q", str(self.work)],
                       check=True, env=HOST_ENV)
        for entry in [self.work / ".git", *(self.work / ".git").rglob("*")]:
            os.chown(entry, self.identity.uid, self.identity.gid, follow_symlinks=False)
        sandbox.sandbox_prepare_dir(self.work, self.identity)

    def plant(self, path: Path, content: str) -> bytes:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        path.chmod(0o644)
        return content.encode()

    # ------------------------------------------------------------------ the attempts

    def egress_attempts(self) -> tuple[list[Attempt], list[str]]:
        connected = marker(b"connected")
        attempts = [
            Attempt("egress", "tcp-postgres-127.0.0.1:5432", ["tcp", "127.0.0.1", "5432"],
                    connected),
            Attempt("egress", "tcp-redis-127.0.0.1:6379", ["tcp", "127.0.0.1", "6379"], connected),
            Attempt("egress", "tcp-external-1.1.1.1:443", ["tcp", "1.1.1.1", "443"], connected,
                    required=False),
            Attempt("egress", "dns-example.com", ["dns", "example.com", *nameservers(), "1.1.1.1"],
                    marker(b"answered"), required=False),
            Attempt("egress", "unix-postgres", ["unix", "/var/run/postgresql/.s.PGSQL.5432"],
                    connected),
        ]
        notes = []
        redis_socket, why = redis_unix_socket()
        if redis_socket:
            attempts.append(Attempt("egress", "unix-redis", ["unix", redis_socket], connected))
        else:
            notes.append(f"attempt: egress unix-redis skipped ({why})")
        return attempts, notes

    def canary_attempts(self) -> list[Attempt]:
        home = Path.home() / f"infraops-canary-{secrets.token_hex(6)}"
        self.cleanup.append(home)
        home_secret = self.plant(home, f"home-canary-{secrets.token_hex(8)}\n")
        canary = secrets.token_hex(8)
        # A stand-in for the service's checkout (never written in the real one): its .env.
        service_env = self.base / "service" / ".env"
        service_secret = self.plant(service_env, f"SECRET_KEY=service-{canary}\n")
        # Another run's worktree, handed to the sandbox uid like every worktree is.
        other = self.base / "other-run-work"
        other_secret = self.plant(other / "canary.txt", f"other-run-{canary}\n")
        sandbox.sandbox_prepare_dir(other, self.identity)
        checkout = ROOT / "pyproject.toml"  # the real checkout, only read
        attempts = [
            Attempt("canary", "worker-home-file", ["read", str(home)], marker(home_secret)),
            Attempt("canary", "service-checkout-.env", ["read", str(service_env)],
                    marker(service_secret)),
            Attempt("canary", "real-checkout-pyproject.toml", ["read", str(checkout)],
                    marker(checkout.read_bytes())),
            Attempt("canary", "/etc/shadow", ["read", "/etc/shadow"],
                    marker(Path("/etc/shadow").read_bytes())),
            Attempt("canary", "other-run-worktree", ["read", str(other / "canary.txt")],
                    marker(other_secret)),
            Attempt("canary", "worker-environ", [
                "environ", CANARY_VAR, f"/proc/{os.getpid()}/environ", "/proc/[0-9]*/environ",
            ], marker(self.token.encode())),
        ]
        # /proc/1/environ: an escape if it holds the worker's canary or is the host's pid 1's.
        worker_canary = marker(self.token.encode())
        try:
            host_pid1: str | None = sha(Path("/proc/1/environ").read_bytes())
            skip = ""
        except OSError as exc:
            host_pid1 = None
            skip = f"the host's /proc/1/environ is unreadable even to root here: {exc}"

        def pid1_escaped(exit_code: int | None, stdout: bytes) -> bool:
            host = host_pid1 is not None and f"READ /proc/1/environ {host_pid1} ".encode() in stdout
            return worker_canary(exit_code, stdout) or host

        attempts.append(Attempt("canary", "/proc/1/environ", ["environ", CANARY_VAR,
                                "/proc/1/environ"], pid1_escaped, host_check=host_pid1 is not None,
                                required=False, host_skip_reason=skip))
        return attempts

    def write_attempts(self) -> list[Attempt]:
        name = f"infraops-bench-escape-{secrets.token_hex(6)}"
        host_tmp, etc, usr = Path("/tmp") / name, Path("/etc") / name, Path("/usr") / name
        out_parent = self.out.parent / name
        hook, config = self.work / ".git" / "hooks" / "post-commit", self.work / ".git" / "config"
        self.cleanup += [host_tmp, etc, usr, out_parent]
        not_real = "would write into the host's real folder; the same write code is checked " \
                   "through the /tmp attempt"
        token = secrets.token_hex(8)
        return [
            Attempt("write", "host-/tmp", ["write", token, str(host_tmp)],
                    host_file(host_tmp.exists)),
            Attempt("write", "/etc", ["write", token, str(etc)], host_file(etc.exists),
                    host_check=False, host_skip_reason=not_real),
            Attempt("write", "/usr", ["write", token, str(usr)], host_file(usr.exists),
                    host_check=False, host_skip_reason=not_real),
            # /work/... is the worktree inside; on the host /work is another folder entirely.
            Attempt("write", ".git/hooks/post-commit",
                    ["write", token, "/work/.git/hooks/post-commit", str(hook)],
                    host_file(hook.exists), host_args=["write", token, str(hook)]),
            Attempt("write", ".git/config", ["write", token, "/work/.git/config", str(config)],
                    host_file(lambda: token in config.read_text()),
                    host_args=["write", token, str(config)]),
            Attempt("write", "out-dir-parent",
                    ["write", token, f"/out/../{name}", str(out_parent)],
                    host_file(out_parent.exists)),
        ]

    def run_attempts(self, group: str, unit_note: str, attempts: Sequence[Attempt],
                     notes: Sequence[str] = ()) -> None:
        succeeded = 0
        for attempt in attempts:
            result = self.run(self.attempt_command(attempt))
            got_through = attempt.escaped(result.exit_code, result.stdout)
            succeeded += got_through
            verdict = "ESCAPED" if got_through else "contained"
            if group == "write" and not got_through and result.exit_code == 0:
                verdict += " (written only inside the sandbox's own tmpfs; absent on the host)"
            print(f"attempt: {group} {attempt.name} {verdict} (exit {result.exit_code}, "
                  f"{result.reason}: {said(result.stdout + result.stderr)})", flush=True)
        for note in notes:
            print(note, flush=True)
        figure(unit_note, succeeded, f"of {len(attempts)}")
        self.failed |= succeeded > 0

    def detector_checks(self, attempts: Sequence[Attempt]) -> None:
        """Run each harmless attempt unconfined on the host: escaped() must then say yes."""
        for attempt in attempts:
            if not attempt.host_check:
                print(f"check: detector-works skipped {attempt.name} "
                      f"({attempt.host_skip_reason})", flush=True)
                continue
            args = attempt.args if attempt.host_args is None else attempt.host_args
            argv = [PYTHON, str(self.work / ATTEMPT_FILE), *args]
            done = subprocess.run(argv, cwd=self.work, env=HOST_ENV, capture_output=True,
                                  timeout=15, check=False)
            works = attempt.escaped(done.returncode, done.stdout)
            if works:
                print(f"check: detector-works yes {attempt.name}", flush=True)
            else:
                kind = "no" if attempt.required else "no-host-baseline"
                print(f"check: detector-works {kind} {attempt.name} (unconfined on the host: "
                      f"{said(done.stdout + done.stderr)})", flush=True)
                self.failed |= attempt.required

    # ------------------------------------------------------------------ containment

    def contained(self, name: str, ok: bool, run: tuple[sandbox.SandboxResult, list[int]],
                  extra: str = "") -> None:
        result, leftovers = run
        ok = ok and not leftovers
        details = f"reason={result.reason} wall={result.wall_seconds:.2f}s{extra}"
        if leftovers:
            details += f" leftover_pids={leftovers}"
        figure(name, int(ok), "bool", details)
        self.failed |= not ok

    def containment(self) -> None:
        small = {"address_space_mb": 256, "file_size_mb": 1}
        run = self.watched(f"{PYTHON} bomb.py", sandbox.SandboxLimits(
            wall_seconds=3.0, cpu_seconds=2, processes=20, **small))
        self.contained("contained_fork_bomb", run[0].reason == sandbox.REASON_PROCESSES, run,
                       f" forks_before_limit={said(run[0].stdout).split()[-1]}")

        run = self.watched(f"{PYTHON} -c 'b = bytearray(1 << 30); b[::4096] = b\"x\" * (1 << 18)'")
        self.contained("contained_memory_hog", run[0].reason == sandbox.REASON_MEMORY, run)

        run = self.watched(f"{PYTHON} -c 'while True: pass'", sandbox.SandboxLimits(
            wall_seconds=5.0, cpu_seconds=1, **small))
        self.contained("contained_cpu_spin", run[0].reason == sandbox.REASON_CPU, run)

        big = self.work / "big"
        run = self.watched("head -c 5000000 /dev/zero > big")
        size = big.stat().st_size if big.exists() else 0
        self.contained("contained_huge_file",
                       run[0].reason == sandbox.REASON_FILE_SIZE and size <= 1 << 20, run,
                       f" file_bytes={size}")
        big.unlink(missing_ok=True)

        cap = 10_000
        run = self.watched("head -c 50000000 /dev/zero; echo done >&2", sandbox.SandboxLimits(
            wall_seconds=5.0, output_bytes=cap, **small))
        result = run[0]
        self.contained("contained_output_flood",
                       len(result.stdout) <= cap and result.output_truncated
                       and result.reason == sandbox.REASON_OK, run,
                       f" kept_stdout_bytes={len(result.stdout)}"
                       f" truncated={result.output_truncated}")

    def disk_attack(self, smoke: bool) -> None:
        """Issue 28's attack: 500,100 empty files (the meter stopped counting at 500,000),
        then 5 x 450 MB under a 2 GB limit; --smoke: 1,100 files against 1,000, then 5 x 16 MB
        under 32 MB. The figures count what the kernel took past each limit (target 0)."""
        limits = sandbox.SandboxLimits(wall_seconds=600.0, file_size_mb=512)
        files, writes, megabytes = 500_100, 5, 450
        if smoke:
            limits = sandbox.SandboxLimits(wall_seconds=120.0, disk_mb=32, inodes=1000)
            files, megabytes = 1_100, 16
        attack = self.base / "disk-attack"
        for part in ("work", "out"):
            sandbox.sandbox_prepare_dir(attack / part, self.identity)
        (attack / "work" / "attack.py").write_text(DISK_ATTACK)
        result = sandbox.sandbox_run(sandbox.SandboxSpec(
            command=f"{PYTHON} attack.py {files} {writes} {megabytes}", workdir=attack / "work",
            out_dir=attack / "out", env={}, limits=limits), identity=self.identity)
        words = result.stdout.split()
        made, wrote = (int(words[1]), int(words[3])) if len(words) == 4 else (0, 0)
        past_bytes = max(wrote - (limits.disk_mb << 20), 0)
        past_files = max(made - limits.inodes, 0)
        extra = (f"reason={result.reason} made={made} wrote={wrote} wall={result.wall_seconds:.1f}s"
                 f" disk_mb={limits.disk_mb} inodes={limits.inodes}")
        figure("disk_attack_bytes_past_limit", past_bytes, "bytes", extra)
        figure("disk_attack_files_past_limit", past_files, "count")
        self.failed |= bool(past_bytes or past_files) or result.reason != sandbox.REASON_DISK
        shutil.rmtree(attack, ignore_errors=True)

    def host_effects(self) -> None:
        """Row S6's host side: how soon the host's CPU is back to its idle level once a CPU
        spin and a fork bomb are stopped, and how much this process (the worker) grows while a
        sandbox floods 1 GiB of stdout through the capped reader."""
        idle = psutil.cpu_percent(interval=1.0)
        recoveries = []
        for command, limits in (
                (f"{PYTHON} -c 'while True: pass' & {PYTHON} -c 'while True: pass'; wait",
                 sandbox.SandboxLimits(wall_seconds=3.0, cpu_seconds=60)),
                (f"{PYTHON} bomb.py", sandbox.SandboxLimits(wall_seconds=3.0, processes=64))):
            self.run(command, limits)
            ended = time.monotonic()
            while (psutil.cpu_percent(interval=0.5) > idle + 25
                   and time.monotonic() - ended < 30):
                pass
            recoveries.append(time.monotonic() - ended)
        figure("host_cpu_recovery_s", f"{max(recoveries):.1f}", "s",
               f" idle_cpu_percent={idle:.0f} (target: within 10 s)")
        before = psutil.Process().memory_info().rss
        result = self.run("head -c 1073741824 /dev/zero", sandbox.SandboxLimits(
            wall_seconds=120.0))
        growth = (psutil.Process().memory_info().rss - before) / (1 << 20)
        figure("worker_rss_growth_mib_1gib_stdout", f"{growth:.1f}", "MiB",
               f" kept_stdout_bytes={len(result.stdout)} written={result.stdout_bytes}"
               " (target < 50)")

    def isolation(self) -> None:
        """Each abuse runs beside a victim run started once the abuse is at its limit (as two
        experiments on two pool processes): victim_failures counts the victims that failed,
        leftover_sandbox_processes what either run left behind, control groups included."""
        victims_failed, left, groups_left, notes = 0, 0, 0, []
        for name, program, limits in ABUSES:
            abuser, victim = self.base / f"{name}-abuser", self.base / f"{name}-victim"
            for folder in (abuser, victim):
                for part in ("work", "out"):
                    sandbox.sandbox_prepare_dir(folder / part, self.identity)
            (abuser / "control").mkdir(mode=0o755)
            (abuser / "work" / "abuse.py").write_text(program)
            (victim / "work" / "victim.py").write_text(VICTIM)
            at_limit = threading.Event()
            abuse_watch, victim_watch = Watch(self.identity.uid, str(abuser)), \
                Watch(self.identity.uid, str(victim))
            done: list[sandbox.SandboxResult] = []

            def on_output(stream: str, chunk: bytes, watch: Watch = abuse_watch,
                          event: threading.Event = at_limit) -> None:
                watch.on_output(stream, chunk)
                if b"AT-LIMIT" in chunk:
                    event.set()

            def abuse(folder: Path = abuser, limits: sandbox.SandboxLimits = limits,
                      on_output: Callable[[str, bytes], None] = on_output,
                      done: list[sandbox.SandboxResult] = done,
                      event: threading.Event = at_limit) -> None:
                try:
                    done.append(sandbox.sandbox_run(sandbox.SandboxSpec(
                        command=Watch.PREFIX + f"{PYTHON} abuse.py", workdir=folder / "work",
                        out_dir=folder / "out", env={}, limits=limits,
                        readonly_binds=[(folder / "control", "/control")]),
                        identity=self.identity, on_output=on_output))
                finally:
                    event.set()  # stopped before it said so (the disk fill, at its limit)

            thread = threading.Thread(target=abuse, name=f"abuse-{name}")
            thread.start()
            at_limit.wait(60)
            try:
                result = sandbox.sandbox_run(sandbox.SandboxSpec(
                    command=Watch.PREFIX + f"{PYTHON} victim.py", workdir=victim / "work",
                    out_dir=victim / "out", env={}, limits=VICTIM_LIMITS),
                    identity=self.identity, on_output=victim_watch.on_output)
            finally:
                (abuser / "control" / "stop").write_text("")
                thread.join()
            abused = done[0] if done else None
            failed = result.reason != sandbox.REASON_OK
            victims_failed += failed
            leftovers = abuse_watch.leftovers() + victim_watch.leftovers()
            left += len(leftovers)
            abuse_watch.close()
            victim_watch.close()
            print(f"attempt: {name} abuser={abused.reason if abused else 'none'} "
                  f"limits_hit={','.join(abused.limits_hit) if abused else ''} "
                  f"victim={result.reason} ({result.detail}) leftovers={leftovers}", flush=True)
            notes.append(f"{name}={'failed' if failed else 'ok'}")
        groups_left = len(own_cgroups())
        figure("victim_failures", victims_failed, "count", " ".join(notes))
        figure("leftover_sandbox_processes", left, "count",
               f"cgroups_left={groups_left} containment={sandbox.sandbox_containment()!r}")
        self.failed |= bool(victims_failed or left or groups_left)

    def timeout_leftovers(self) -> None:
        started = time.monotonic()
        result, left = self.watched("setsid sleep 300 & (sleep 300 &); sleep 300",
                                    sandbox.SandboxLimits(wall_seconds=1.0, address_space_mb=256,
                                                          file_size_mb=1))
        returned_after = time.monotonic() - started
        others = len(sandbox_uid_processes(self.identity.uid)) - len(left)
        figure("timeout_leftover_processes", len(left), "count",
               f"reason={result.reason} returned_after={returned_after:.2f}s "
               f"other_runs_processes_of_the_uid={others}")
        self.failed |= bool(left) or result.reason != sandbox.REASON_TIMEOUT

    def start_median(self, starts: int = 30) -> None:
        """Row S9: the median of starts of `true`; each is followed by one without the disk
        scratch (as a sandbox started by a user other than root runs), so that what the
        scratch's mounts and unmounts cost is read off the same machine at the same moment."""
        limits = sandbox.SandboxLimits(wall_seconds=10.0)
        self.run("true", limits)
        runs: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(starts):
            for with_scratch in (True, False):
                started = time.perf_counter()
                with without_scratch(not with_scratch):
                    result = self.run("true", limits)
                runs[with_scratch].append((time.perf_counter() - started) * 1000)
                if result.reason != sandbox.REASON_OK:
                    print(f"attempt: start `true` failed: {result.detail}", flush=True)
                    self.failed = True
        supervisor = "compiled" if os.access(sandbox.SUPERVISOR_BINARY, os.X_OK) else "python"
        median = statistics.median(runs[True])
        figure("sandbox_start_median_ms", f"{median:.1f}", "ms", f"supervisor={supervisor}")
        figure("sandbox_start_median_ms_without_scratch",
               f"{statistics.median(runs[False]):.1f}", "ms")

    def remove(self) -> None:
        shutil.rmtree(self.base, ignore_errors=True)
        for path in self.cleanup:
            path.unlink(missing_ok=True)


@contextlib.contextmanager
def without_scratch(off: bool) -> Iterator[None]:
    """While off, sandboxes start with no disk scratch (the walking meter instead)."""
    if not off:
        yield
        return
    make = scratch._Scratch.make
    scratch._Scratch.make = staticmethod(lambda spec: None)  # type: ignore[method-assign]
    try:
        yield
    finally:
        scratch._Scratch.make = make  # type: ignore[method-assign]


def own_cgroups() -> list[Path]:
    """Control groups of this process's runs still there (none once every run has ended)."""
    try:
        places = cgroups._cgroup_places()
    except OSError:
        return []
    folders = [*places.v1.values(), *([places.v2] if places.v2 is not None else [])]
    return [entry for folder in folders
            for entry in (folder / sandbox.CGROUP_FOLDER).glob(f"r{os.getpid()}-*")]


def nameservers() -> list[str]:
    try:
        lines = Path("/etc/resolv.conf").read_text().splitlines()
    except OSError:
        return []
    return [line.split()[1] for line in lines
            if line.startswith("nameserver") and len(line.split()) > 1 and ":" not in line]


def redis_unix_socket() -> tuple[str, str]:
    """(socket path, "") or ("", why there is none)."""
    try:
        done = subprocess.run(["redis-cli", "CONFIG", "GET", "unixsocket"], capture_output=True,
                              text=True, timeout=5, check=False, env=HOST_ENV)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return "", f"redis-cli CONFIG GET unixsocket failed: {exc}"
    lines = done.stdout.splitlines()
    if done.returncode != 0 or not lines or lines[0] != "unixsocket":
        return "", f"redis-cli CONFIG GET unixsocket failed: {done.stdout or done.stderr}".strip()
    path = lines[1].strip() if len(lines) > 1 else ""
    if not path:
        return "", "Redis has no unix socket: CONFIG GET unixsocket is empty"
    return path, ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true",
                        help="attempts, containment, timeout and 3 starts; exits 0 on a miss")
    args = parser.parse_args()
    if CANARY_VAR not in os.environ:
        # /proc/PID/environ shows the environment a process started with, not os.environ: start
        # again with the canary in it, so that it is in this (the worker's) process for real.
        env = {**os.environ, CANARY_VAR: f"worker-env-canary-{secrets.token_hex(8)}"}
        os.execve(sys.executable, [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]],
                  env)
    problem = sandbox.sandbox_check()
    if problem is not None:
        print(f"error: no sandbox here: {problem}", file=sys.stderr)
        return 1
    bench = Bench(os.environ[CANARY_VAR])
    started = time.monotonic()
    try:
        bench.prepare()
        egress, notes = bench.egress_attempts()
        canaries = bench.canary_attempts()
        writes = bench.write_attempts()
        bench.run_attempts("egress", "egress_attempts_succeeded", egress, notes)
        bench.run_attempts("canary", "canary_reads_succeeded", canaries)
        bench.run_attempts("write", "writes_outside_worktree_succeeded", writes)
        # Only now, so that the host-side checks above saw nothing the detector run wrote.
        bench.detector_checks([*egress, *canaries, *writes])
        bench.containment()
        bench.disk_attack(args.smoke)
        if not args.smoke:
            bench.host_effects()
        bench.timeout_leftovers()
        if not args.smoke:
            bench.isolation()
        bench.start_median(3 if args.smoke else 30)
    finally:
        bench.remove()
    print(f"total: {time.monotonic() - started:.1f} s", flush=True)
    if bench.failed and args.smoke:
        print("a figure missed its target (not judged in smoke mode)", file=sys.stderr)
        return 0
    return 1 if bench.failed else 0


if __name__ == "__main__":
    sys.exit(main())
