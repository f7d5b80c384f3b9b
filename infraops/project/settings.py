"""InfraOps settings: every value comes from the environment (django-environ).

A malformed value stops start-up with one sentence naming the variable, never a traceback.
With DATABASE_URL / REDIS_URL unset, the embedded PostgreSQL and Redis that
`manage.py standalone` starts in the data folder are used
(infraops/management/commands/standalone.py).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import environ

BASE_DIR = Path(__file__).resolve().parents[2]


class _ConfigError(Exception):
    pass


env = environ.Env()


TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off", ""}


def _read(name: str, kind: str, default: Any) -> Any:
    """One variable, parsed; a bad value becomes one sentence naming it."""
    if kind == "bool":
        # django-environ reads any unknown word as False: 'INFRAOPS_SECURE=yess' must not
        # quietly turn the HTTPS settings off.
        raw = env.str(name, default=str(default)).strip().lower()
        if raw not in TRUE_WORDS | FALSE_WORDS:
            raise _ConfigError(f"{name}={raw!r} is not a valid bool (use true or false).")
        return raw in TRUE_WORDS
    try:
        return getattr(env, kind)(name, default=default)
    except Exception as exc:  # django-environ raises several types for bad values
        raw = env.str(name, default="")
        raise _ConfigError(f"{name}={raw!r} is not a valid {kind} ({exc}).") from None


def _uid_range(text: str) -> range:
    """ "first-last" (inclusive) as a range of uids; "" as an empty one."""
    if not text.strip():
        return range(0)
    first, dash, last = text.strip().partition("-")
    try:
        pool = range(int(first), int(last) + 1) if dash else range(0)
    except ValueError:
        pool = range(0)
    if not pool or pool.start <= 0 or pool.stop - 1 >= (1 << 32) - 1:
        raise _ConfigError(f"INFRAOPS_SANDBOX_UID_POOL={text!r} must be 'first-last', two "
                           "uids with 0 < first <= last < 4294967295, or empty.")
    return pool


def _path_list(name: str, default: str) -> tuple[str, ...]:
    """A ":"-separated list of absolute paths (empty entries skipped), as PATH is written."""
    paths = tuple(part for part in _read(name, "str", default).split(":") if part.strip())
    for path in paths:
        if not path.startswith("/"):
            raise _ConfigError(f"{name}: {path!r} is not an absolute path.")
    return paths


PROCESS_KINDS = ("web", "worker", "other")
_WEB_SERVERS = ("uvicorn", "gunicorn", "daphne", "hypercorn", "granian")


def process_kind(argv: list[str], override: str = "") -> str:
    """'web' (an ASGI server), 'worker' (a Celery worker) or 'other' (manage.py commands,
    tests), from INFRAOPS_PROCESS when set, else from how the process was started:
    `python -m uvicorn ...` runs uvicorn/__main__.py, the console script is .../bin/uvicorn."""
    if override:
        if override not in PROCESS_KINDS:
            raise _ConfigError(f"INFRAOPS_PROCESS={override!r} must be one of "
                               f"{', '.join(PROCESS_KINDS)}.")
        return override
    program = Path(argv[0]) if argv and argv[0] else Path()
    name = program.parent.name if program.name == "__main__.py" else program.name
    if name in _WEB_SERVERS:
        return "web"
    if name == "celery" and "worker" in argv[1:]:
        return "worker"
    return "other"


def _connections(config: dict[str, Any], kind: str, pool_size: int) -> None:
    """How each kind of process holds its database connections.

    web: under ASGI every request runs in a thread of its own, so a persistent connection
    (CONN_MAX_AGE > 0) was left open in every thread that ever served a request: 5 x 10
    concurrent requests left 31 open for over a minute, and 30 clients drove PostgreSQL to 'too
    many clients' (29% of responses 500). Django's docs: under ASGI, disable persistent
    connections, or pool them. So CONN_MAX_AGE = 0 and, by default, a psycopg pool of at most
    INFRAOPS_DB_POOL_SIZE connections (DEFAULT_POOL_SIZE): the count stays bounded whatever the
    concurrency, and a request takes a connection that is already open. A new connection per
    request (INFRAOPS_DB_POOL_SIZE=0) cost PostgreSQL a backend process, and its cold caches,
    every time: about 9 ms of the machine's CPU a request out of 30 on the load bench
    (bench/load.py), and 66 instead of 94 requests/s. Every checkout is checked first
    (CONN_HEALTH_CHECKS: psycopg's check_connection), so a connection the database dropped (a
    restart, a terminated backend) is replaced before a request uses it. The price: a request
    waits up to POOL_TIMEOUT s for a free connection, and while the database is down or
    refusing, requests wait that long before their 503 page (without a pool it comes at once).
    INFRAOPS_DB_POOL_SIZE=0: no pool, a connection per request, at most one per request in
    flight, none when idle.
    worker: one thread runs the tasks of a Celery process; its connection is kept and checked
    per task (a new connection per task cost 4-5 ms of every experiment; see
    infraops/project/celery.py).
    other: commands and tests: nothing kept across requests.

    Every kind binds parameters on the server and prepares a statement once a connection has
    run it twice (PREPARE_THRESHOLD): PostgreSQL then plans it once per connection. The
    pages' queries join four to six tables, and planning was most of their cost: the dashboard's
    runs query took 5.6 ms of which 4 ms planning, 1.6 ms prepared; on the load bench's 2 cores
    PostgreSQL's planning competed with the web process for the CPU."""
    config["CONN_HEALTH_CHECKS"] = True
    options = config.setdefault("OPTIONS", {})
    options["connect_timeout"] = 10
    options["server_side_binding"] = True
    options["prepare_threshold"] = PREPARE_THRESHOLD
    if kind == "worker":
        config["CONN_MAX_AGE"] = 60
        return
    config["CONN_MAX_AGE"] = 0
    if kind == "web" and pool_size > 0:
        config["OPTIONS"]["pool"] = {
            "min_size": min(POOL_MIN_SIZE, pool_size), "max_size": pool_size,
            "timeout": POOL_TIMEOUT, "max_idle": 60.0,
            # Give up a failing reconnection after this long, so that the next request
            # starts a fresh attempt: the pool's own backoff doubles up to minutes, and the
            # site would stay on the 503 page long after the database is back.
            "reconnect_timeout": POOL_TIMEOUT,
        }


# The web process's pool (INFRAOPS_DB_POOL_SIZE > 0): connections kept open, and
# seconds a request waits for a free one (or for the database to answer) before its 503.
POOL_MIN_SIZE = 2
DEFAULT_POOL_SIZE = 10
DEFAULT_WEB_THREADS = 8
DEFAULT_MAX_WEB_PROCESSES = 4
POOL_TIMEOUT = 5.0
PREPARE_THRESHOLD = 2  # runs of a query on one connection before psycopg prepares it


def _database(url: str | None, data_dir: Path) -> dict[str, Any]:
    if not url:
        # Embedded PostgreSQL started by `manage.py standalone`: a unix socket in the data folder.
        url = f"postgres://postgres@{quote(str(data_dir / 'pgdata'), safe='')}/infraops"
    try:
        config: dict[str, Any] = environ.Env.db_url_config(url)
    except Exception as exc:
        raise _ConfigError(f"DATABASE_URL={url!r} is not a database URL ({exc}).") from None
    if config.get("ENGINE") != "django.db.backends.postgresql":
        raise _ConfigError(
            f"DATABASE_URL={url!r} must be a PostgreSQL URL (postgres://user@host:port/name): "
            "InfraOps relies on row locks, SKIP LOCKED and JSONB."
        )
    # A unix-socket folder is written percent-encoded in the host part (libpq's URL form).
    config["HOST"] = unquote(config.get("HOST", ""))
    return config


def _redis(url: str | None, data_dir: Path) -> str:
    if not url:
        return f"unix://{data_dir / 'redis.sock'}"
    if not url.startswith(("redis://", "rediss://", "unix://")):
        raise _ConfigError(f"REDIS_URL={url!r} must start with redis://, rediss:// or unix://.")
    return url


def _celery_broker(redis_url: str) -> str:
    # Celery spells a unix-socket Redis as redis+socket:///path.
    if redis_url.startswith("unix://"):
        return "redis+socket://" + redis_url.removeprefix("unix://")
    return redis_url


def _channel_prefix(redis_url: str) -> str:
    """The channel layer's name prefix, one per Redis database. Pub/sub channels belong to the
    whole Redis server, not to a database: without it two installations (or a test session
    beside another) on one server received each other's live updates."""
    parts = urlsplit(redis_url)
    database = parse_qs(parts.query).get("db", [""])[0] if parts.scheme == "unix" else \
        parts.path.strip("/")
    return f"infraops.db{database or '0'}"


def _secret_key_fallback(data_dir: Path, debug: bool) -> str:
    """The key when SECRET_KEY is unset: the one `manage.py standalone` keeps in the data
    folder (made here on its first start, as standalone would); under DEBUG a development
    key; in a test session (pytest sets PYTEST_VERSION for itself and its children) a random
    key shared with those children. Otherwise start-up stops: a service with a published key
    would accept anyone's forged session cookies."""
    key_file = data_dir / "secret_key"
    if key_file.exists():
        key = key_file.read_text().strip()
        if key:
            return key
    if Path(sys.argv[0]).name == "manage.py" and sys.argv[1:2] == ["standalone"]:
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
            key_file.write_text(secrets.token_urlsafe(50))
            key_file.chmod(0o600)
        except OSError as exc:
            raise _ConfigError(f"INFRAOPS_DATA={str(data_dir)!r}: cannot write the secret key "
                               f"({exc}).") from None
        return key_file.read_text().strip()
    if debug:
        return "django-insecure-infraops-development-key"
    if os.environ.get("PYTEST_VERSION"):
        os.environ["SECRET_KEY"] = os.environ.get("SECRET_KEY") or secrets.token_urlsafe(50)
        return os.environ["SECRET_KEY"]
    raise _ConfigError("SECRET_KEY is not set: set it to a long random value (or DEBUG=true "
                       "for development; `manage.py standalone` makes its own).")


def _blob_storage(backend: str, options: str, data_dir: Path) -> dict[str, Any]:
    """STORAGES["blobs"]: by default the files under <data>/blobs, as they always were.
    INFRAOPS_BLOB_STORAGE names another Django storage backend (a dotted path) and
    INFRAOPS_BLOB_STORAGE_OPTIONS its options as a JSON object: with django-storages installed,
    "storages.backends.s3.S3Storage" and {"bucket_name": "...", "endpoint_url": "..."} keep
    them in an S3-compatible store."""
    try:
        parsed = json.loads(options) if options.strip() else {}
    except ValueError as exc:
        raise _ConfigError(f"INFRAOPS_BLOB_STORAGE_OPTIONS is not JSON ({exc}).") from None
    if not isinstance(parsed, dict):
        raise _ConfigError("INFRAOPS_BLOB_STORAGE_OPTIONS must be a JSON object, such as "
                           '{"bucket_name": "infraops-blobs"}.')
    backend = backend.strip()
    if not backend:
        return {"BACKEND": "django.core.files.storage.FileSystemStorage",
                "OPTIONS": {"location": str(data_dir / "blobs"), **parsed}}
    if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+", backend):
        raise _ConfigError(f"INFRAOPS_BLOB_STORAGE={backend!r} is not a dotted path to a "
                           "storage class.")
    return {"BACKEND": backend, "OPTIONS": parsed}


try:
    DATA_DIR = Path(_read("INFRAOPS_DATA", "str", str(BASE_DIR / ".infraops"))).resolve()
    DEBUG = _read("DEBUG", "bool", False)
    SECRET_KEY = _read("SECRET_KEY", "str", "")
    ALLOWED_HOSTS = _read("ALLOWED_HOSTS", "list", ["localhost", "127.0.0.1", "[::1]"])
    CSRF_TRUSTED_ORIGINS = _read("CSRF_TRUSTED_ORIGINS", "list", [])
    DATABASES = {"default": _database(_read("DATABASE_URL", "str", ""), DATA_DIR)}
    PROCESS_KIND = process_kind(sys.argv, _read("INFRAOPS_PROCESS", "str", "").strip())
    DB_POOL_SIZE = _read("INFRAOPS_DB_POOL_SIZE", "int", DEFAULT_POOL_SIZE)
    if not 0 <= DB_POOL_SIZE <= 90:
        raise _ConfigError(f"INFRAOPS_DB_POOL_SIZE={DB_POOL_SIZE} must be from 0 (no pool: a "
                           "connection per request) to 90.")
    _connections(DATABASES["default"], PROCESS_KIND, DB_POOL_SIZE)
    # Threads that serve the web process's HTTP requests (infraops/project/asgi.py): each holds at
    # most
    # one of the pool's connections, and the websockets' database calls need one too.
    WEB_THREADS = _read("INFRAOPS_WEB_THREADS", "int",
                        max(min(DEFAULT_WEB_THREADS, DB_POOL_SIZE - 2), 1) if DB_POOL_SIZE
                        else DEFAULT_WEB_THREADS)
    if not 1 <= WEB_THREADS <= 64:
        raise _ConfigError(f"INFRAOPS_WEB_THREADS={WEB_THREADS} must be from 1 to 64.")
    # Web processes `standalone` starts (uvicorn's --workers): the pages are Python, and one
    # process runs on one core at a time (the GIL), so one per core, up to
    # DEFAULT_MAX_WEB_PROCESSES. Each has its own pool of DB_POOL_SIZE connections.
    WEB_PROCESSES = _read("INFRAOPS_WEB_PROCESSES", "int",
                          min(os.cpu_count() or 1, DEFAULT_MAX_WEB_PROCESSES))
    if not 1 <= WEB_PROCESSES <= 32:
        raise _ConfigError(f"INFRAOPS_WEB_PROCESSES={WEB_PROCESSES} must be from 1 to 32.")
    REDIS_URL = _redis(_read("REDIS_URL", "str", ""), DATA_DIR)
    OPENAI_BASE_URL = _read("OPENAI_BASE_URL", "str", "")
    OPENAI_API_KEY = _read("OPENAI_API_KEY", "str", "")
    INFRAOPS_MODEL = _read("INFRAOPS_MODEL", "str", "")
    # USD per million tokens, for the runs' cost budgets (0: cost is not accounted).
    LLM_PRICE_IN_PER_MTOK = _read("INFRAOPS_PRICE_IN_PER_MTOK", "float", 0.0)
    LLM_PRICE_OUT_PER_MTOK = _read("INFRAOPS_PRICE_OUT_PER_MTOK", "float", 0.0)
    # Seconds; the longest Celery task limit. The broker's visibility timeout is 1.5x of it.
    TASK_TIME_LIMIT = _read("INFRAOPS_TASK_TIME_LIMIT", "int", 3600)
    SECURE = _read("INFRAOPS_SECURE", "bool", False)
    # Seconds a run keeps retrying a failing model endpoint (5xx, timeouts, refused
    # connections) before it pauses with the reason; Resume retries again.
    LLM_RETRY_SECONDS = _read("INFRAOPS_LLM_RETRY_SECONDS", "float", 300.0)
    # Seconds one request to the model endpoint may take in all, from connecting to the
    # answer's last byte (agents/llm.py); a step sends one request, so this is the longest an
    # agent worker is held by an endpoint that never answers or trickles its answer a byte at
    # a time. By default 60 s, or half the task
    # time limit where that is shorter (a step must end inside its task's limit).
    LLM_TIMEOUT = _read("INFRAOPS_LLM_TIMEOUT", "float", min(60.0, max(TASK_TIME_LIMIT, 2) / 2))
    # The most one probe execution's sandbox may take (infraops/experiments/sandbox/config.py,
    # SandboxLimits):
    # processes and threads, total memory (its tmpfs files included) and MB added to its work
    # tree and output. A probe asking for no limit gets the sandbox's default, at most these.
    SANDBOX_MAX_PROCESSES = _read("INFRAOPS_SANDBOX_MAX_PROCESSES", "int", 1024)
    SANDBOX_MAX_MEMORY_MB = _read("INFRAOPS_SANDBOX_MAX_MEMORY_MB", "int", 8192)
    SANDBOX_MAX_DISK_MB = _read("INFRAOPS_SANDBOX_MAX_DISK_MB", "int", 8192)
    # The files and folders one execution may create in its work tree and output: each costs
    # the kernel about 1 KiB that disk_mb does not count, and the worker walks every one a run
    # leaves (infraops/experiments/sandbox/scratch.py). Not asked for by a probe.
    SANDBOX_MAX_INODES = _read("INFRAOPS_SANDBOX_MAX_INODES", "int", 100_000)
    # Where a sandbox cannot get its own pids control group, each experiment runs as a uid of
    # its own from this range ("first-last"; numeric ids no account uses), so the per-uid
    # process limit is per experiment (infraops.experiments.sandbox.sandbox_identity_lease). Empty:
    # off.
    SANDBOX_UID_POOL = _uid_range(_read("INFRAOPS_SANDBOX_UID_POOL", "str",
                                        "1900000000-1900000255"))
    # Host folders bound read-only, at their own path, into every probe's sandbox, their bin/
    # first on its PATH (":"-separated, as PATH): the toolchains probes may use beyond /usr,
    # such as a Python environment with torch and Triton on a GPU worker (docs/gpu.md).
    SANDBOX_TOOLCHAINS = _path_list("INFRAOPS_SANDBOX_TOOLCHAINS", "")
    # The device nodes a probe that requires "gpu" is given (":"-separated globs); only
    # accelerator nodes are ever given, whatever a pattern matches
    # (infraops/experiments/accelerators.py).
    SANDBOX_GPU_DEVICES = _path_list(
        "INFRAOPS_SANDBOX_GPU_DEVICES",
        "/dev/nvidia[0-9]*:/dev/nvidiactl:/dev/nvidia-uvm:/dev/nvidia-uvm-tools"
        ":/dev/nvidia-caps/nvidia-cap[0-9]*:/dev/kfd:/dev/dri/renderD[0-9]*")
    # A cgroup v2 folder holding no process, delegated to the workers, under which each probe
    # run gets its control groups where the worker's own group cannot hand controllers down (a
    # container's or a service's group: cgroup v2's no-internal-processes rule). Read by
    # infraops/experiments/sandbox/cgroups.py from the environment; checked here.
    SANDBOX_CGROUP = _read("INFRAOPS_SANDBOX_CGROUP", "str", "")
    if SANDBOX_CGROUP and not SANDBOX_CGROUP.startswith("/"):
        raise _ConfigError(f"INFRAOPS_SANDBOX_CGROUP: {SANDBOX_CGROUP!r} is not an absolute path.")
    # Set by `standalone` for its processes when it starts a GPU worker beside the others, so
    # that its showcase starts the demo's GPU goal (agents/management/commands/start_runs.py).
    GPU_WORKER = _read("INFRAOPS_GPU_WORKER", "bool", False)
    # Which repository URLs a target may name (infraops/repourls.py): remote schemes, hosts
    # (exact names or ".domain"; empty: any host), folders local repositories may come from
    # (":"-separated; a folder inside or above the data folder or the checkout is ignored, as
    # what lies inside those two is never reachable), and whether
    # loopback, link-local and private addresses may be reached (off: a URL is a request the
    # server makes on a user's behalf).
    REPO_SCHEMES = tuple(word.strip().lower() for word in
                         _read("INFRAOPS_REPO_SCHEMES", "list", ["https", "ssh"]) if word.strip())
    if not set(REPO_SCHEMES) <= {"https", "http", "ssh", "git"}:
        raise _ConfigError(f"INFRAOPS_REPO_SCHEMES={','.join(REPO_SCHEMES)!r} may name only "
                           "https, http, ssh and git (local paths: INFRAOPS_REPO_LOCAL_ROOTS).")
    REPO_HOSTS = tuple(word.strip().lower() for word in
                       _read("INFRAOPS_REPO_HOSTS", "list", []) if word.strip())
    REPO_LOCAL_ROOTS = _path_list("INFRAOPS_REPO_LOCAL_ROOTS", "")
    REPO_PRIVATE_ADDRESSES = _read("INFRAOPS_REPO_PRIVATE_ADDRESSES", "bool", False)
    # Approvals and run starts one user may make per window (infraops/ratelimit.py).
    RATE_APPROVE_PER_MIN = _read("INFRAOPS_RATE_APPROVE_PER_MIN", "int", 100)
    RATE_START_RUN_PER_MIN = _read("INFRAOPS_RATE_START_RUN_PER_MIN", "int", 100)
    # Separation of duties (infraops/grants.py): a reviewer's rights on a target granted
    # less than this many hours ago decide no change yet, so an admin cannot make a fresh
    # account and have it approve at once; 0 turns the cool-down off. The default until an
    # admin sets one in the admin editor (GrantPolicy). Grants made by the operator at the
    # command line (adduser, the first start's users) are not held to it.
    REVIEW_GRANT_COOLDOWN_HOURS = _read("INFRAOPS_REVIEW_GRANT_COOLDOWN_HOURS", "float", 24.0)
    if not 0 <= REVIEW_GRANT_COOLDOWN_HOURS <= 24 * 365:
        raise _ConfigError(f"INFRAOPS_REVIEW_GRANT_COOLDOWN_HOURS={REVIEW_GRANT_COOLDOWN_HOURS:g} "
                           "must be between 0 and 8760 (a year).")
    # Workers on other hosts (docs/architecture.md, "The fleet"). WEB_URL "" means this
    # process shares the web's data folder (one host); else the worker fetches git and blobs
    # from the web over HTTP, authenticated by WORKER_TOKEN (`manage.py worker_register`).
    WEB_URL = _read("INFRAOPS_WEB_URL", "str", "").strip().rstrip("/")
    WORKER_TOKEN = _read("INFRAOPS_WORKER_TOKEN", "str", "").strip()
    if WEB_URL and not WEB_URL.startswith(("http://", "https://")):
        raise _ConfigError(f"INFRAOPS_WEB_URL={WEB_URL!r} must start with http:// or https://.")
    # How long a claim holds an experiment without a renewal (renewed every quarter of it while
    # probes run): a worker lost without a goodbye costs this, plus the reaper's 30 s, before
    # another worker runs its experiment (infraops/experiments/services.py).
    EXPERIMENT_LEASE_SECONDS = _read("INFRAOPS_EXPERIMENT_LEASE_SECONDS", "float", 60.0)
    if not 5 <= EXPERIMENT_LEASE_SECONDS <= 3600:
        raise _ConfigError(f"INFRAOPS_EXPERIMENT_LEASE_SECONDS={EXPERIMENT_LEASE_SECONDS} must be "
                           "between 5 and 3600.")
    # How long a worker retries a request the network or a restarting web fails
    # (infraops/experiments/remote.py).
    WEB_RETRY_SECONDS = _read("INFRAOPS_WEB_RETRY_SECONDS", "float", 120.0)
    # The largest blob (a probe's output file) a worker may upload: 2 GiB by default.
    BLOB_MAX_BYTES = _read("INFRAOPS_BLOB_MAX_BYTES", "int", 2 << 30)
    BLOB_STORAGE = _blob_storage(_read("INFRAOPS_BLOB_STORAGE", "str", ""),
                                 _read("INFRAOPS_BLOB_STORAGE_OPTIONS", "str", ""), DATA_DIR)
    if not SECRET_KEY:
        SECRET_KEY = _secret_key_fallback(DATA_DIR, DEBUG)
    if TASK_TIME_LIMIT <= 0:
        raise _ConfigError(f"INFRAOPS_TASK_TIME_LIMIT={TASK_TIME_LIMIT} must be positive.")
    if not 0 <= LLM_RETRY_SECONDS <= 7 * 24 * 3600:
        raise _ConfigError(f"INFRAOPS_LLM_RETRY_SECONDS={LLM_RETRY_SECONDS} must be between 0 "
                           "and a week.")
    if not 1 <= LLM_TIMEOUT <= min(3600, max(TASK_TIME_LIMIT, 2) / 2):
        raise _ConfigError(f"INFRAOPS_LLM_TIMEOUT={LLM_TIMEOUT} must be from 1 s to an hour "
                           "and at most half of INFRAOPS_TASK_TIME_LIMIT.")
    for _name, _value in (("INFRAOPS_SANDBOX_MAX_PROCESSES", SANDBOX_MAX_PROCESSES),
                          ("INFRAOPS_SANDBOX_MAX_MEMORY_MB", SANDBOX_MAX_MEMORY_MB),
                          ("INFRAOPS_SANDBOX_MAX_DISK_MB", SANDBOX_MAX_DISK_MB),
                          ("INFRAOPS_SANDBOX_MAX_INODES", SANDBOX_MAX_INODES),
                          ("INFRAOPS_RATE_APPROVE_PER_MIN", RATE_APPROVE_PER_MIN),
                          ("INFRAOPS_RATE_START_RUN_PER_MIN", RATE_START_RUN_PER_MIN),
                          ("INFRAOPS_BLOB_MAX_BYTES", BLOB_MAX_BYTES)):
        if _value <= 0:
            raise _ConfigError(f"{_name}={_value} must be positive.")
except _ConfigError as error:
    sys.exit(f"InfraOps configuration error: {error}")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "django_htmx",
    "template_partials",
    "channels",
    "infraops",
    "reviews",
    "agents",
    "skeletons",
]

MIDDLEWARE = [
    # First: a database that does not answer gives the 503 page, whichever layer met it.
    "infraops.project.middleware.DatabaseUnavailableMiddleware",
    # Before anything reads a form body: one Django cannot read gives its 400 page, not a 500.
    "infraops.project.middleware.FormEncodingMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "infraops.project.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "infraops.project.middleware.ContentSecurityPolicyMiddleware",
    # Inside the CSP: its page gets the policy too.
    "infraops.project.middleware.MethodNotAllowedPageMiddleware",
]

ROOT_URLCONF = "infraops.project.urls"
# Django's form renderer, with selects drawn in Python (infraops/project/formrenderer.py).
FORM_RENDERER = "infraops.project.formrenderer.FormRenderer"
ASGI_APPLICATION = "infraops.project.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "infraops.project.context_processors.infraops",
                "reviews.context_processors.review_queue",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# ModelBackend, with each request's user read in one query with its role groups and reviewer
# profile (reviews/backends.py). Sessions made under another backend sign in again.
AUTHENTICATION_BACKENDS = ["reviews.backends.OneQueryUserBackend"]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "agents:dashboard"
LOGOUT_REDIRECT_URL = "login"
# Sign-in throttle (infraops/project/login.py): so many failures for one username, or from one
# address, within the window lock further attempts for LOGIN_LOCKOUT_SECONDS. Counts live in
# Redis (the "login" cache), shared by every web process.
LOGIN_FAILURES_PER_USERNAME = 5
LOGIN_FAILURES_PER_ADDRESS = 20
LOGIN_FAILURE_WINDOW_SECONDS = 15 * 60
LOGIN_LOCKOUT_SECONDS = 15 * 60
CACHES: dict[str, dict[str, Any]] = {
    "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
    "login": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL,
              "KEY_PREFIX": "infraops-login"},
    "limits": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL,
               "KEY_PREFIX": "infraops-limits"},
    # Rendered fragments of rows that never change (a run's log rows): per process, bounded
    # (a row is well under a kilobyte; the oldest third goes when full).
    "fragments": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                  "LOCATION": "infraops-fragments", "OPTIONS": {"MAX_ENTRIES": 20000}},
    # Parts of pages that show a finished experiment's record (its charts, feedback, tables and
    # probe output: infraops/fragments.py): per process, bounded (a part is tens of kilobytes,
    # a long probe output up to a few megabytes).
    "experiments": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                    "LOCATION": "infraops-experiments", "OPTIONS": {"MAX_ENTRIES": 300}},
    # A change page's diff tables, per state of the change (reviews/views/change.py): per
    # process, bounded (a diff's tables are tens of kilobytes, one of the largest diffs a page
    # highlights a few megabytes: 64 of those at most, the oldest third going when full).
    "changes": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                "LOCATION": "infraops-changes", "OPTIONS": {"MAX_ENTRIES": 64}},
}
# The window of the per-user rate limits (seconds); the limits are counted per window.
RATE_WINDOW_SECONDS = 60

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
# Our own files only, never a CDN: plotly.js is the cartesian bundle in static/vendor/plotly
# (a third of the full bundle the plotly package carries; its README says why and how).
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "staticfiles"
# Collected (manage.py prepare): hashed names, gzip copies, a year's cache (infraops/staticfiles).
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "infraops.project.staticfiles.HashedStaticFiles"},
    # Probe outputs, content-addressed: "<sha256[:2]>/<sha256>"
    # (infraops/experiments/blobstore.py).
    "blobs": BLOB_STORAGE,
}
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Security headers. HTTPS-only flags follow INFRAOPS_SECURE (production behind TLS).
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Django's database sessions, read in one plain statement.
SESSION_ENGINE = "infraops.project.sessions"
SESSION_COOKIE_HTTPONLY = True
# No script reads the CSRF cookie: htmx sends the token from hx-headers on <body> and forms
# carry it as a field, so the cookie is HttpOnly too (reliability row D9).
CSRF_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
CSRF_COOKIE_SAMESITE = "Lax"
SESSION_COOKIE_SECURE = SECURE
CSRF_COOKIE_SECURE = SECURE
SECURE_SSL_REDIRECT = SECURE
SECURE_HSTS_SECONDS = 31536000 if SECURE else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE
SECURE_HSTS_PRELOAD = SECURE
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if SECURE else None

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
        "CONFIG": {"hosts": [{"address": REDIS_URL}], "prefix": _channel_prefix(REDIS_URL)},
    }
}

# Celery: the reliability rules of docs/product.md. A SIGKILLed worker with Celery's
# defaults lost 10 of 20 experiments on this machine class.
CELERY_BROKER_URL = _celery_broker(REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_TIME_LIMIT = TASK_TIME_LIMIT
CELERY_TASK_SOFT_TIME_LIMIT = int(TASK_TIME_LIMIT * 0.9)
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": int(TASK_TIME_LIMIT * 1.5)}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Celery's Django fixup closes every database connection around each task unless this is set:
# a new connection per task cost 4-5 ms of every experiment here. Connections are kept and
# checked per task the way Django does per request instead (CONN_MAX_AGE, CONN_HEALTH_CHECKS;
# see infraops/project/celery.py).
CELERY_DB_REUSE_MAX = 1_000_000
CELERY_TASK_DEFAULT_QUEUE = "agent"
CELERY_TASK_ROUTES = {
    "agents.tasks.*": {"queue": "agent"},
    "infraops.tasks.experiment_execute": {"queue": "experiments"},
    # Every installation runs agent workers (runs need them): the reaper goes there.
    "infraops.tasks.experiments_reap": {"queue": "agent"},
    "infraops.tasks.target_fetch": {"queue": "agent"},
    "reviews.tasks.*": {"queue": "agent"},
    "skeletons.tasks.*": {"queue": "agent"},
}
CELERY_BEAT_SCHEDULE = {
    "reap-expired-leases": {"task": "infraops.tasks.experiments_reap", "schedule": 30.0},
    "requeue-stalled-runs": {"task": "agents.tasks.runs_reap", "schedule": 60.0},
    # Finishes merges a killed process left half done, and merges re-verified changes.
    "advance-merges": {"task": "reviews.tasks.changes_reap", "schedule": 15.0},
    # Delivers the requests for changes a killed web process left undelivered.
    "deliver-requested-changes": {"task": "reviews.tasks.requested_changes_deliver",
                                  "schedule": 60.0},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "INFO"},
    "loggers": {"django.db.backends": {"level": "WARNING"}, "pgserver": {"level": "WARNING"}},
}
