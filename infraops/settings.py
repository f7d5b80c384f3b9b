"""InfraOps settings: every value comes from the environment (django-environ).

A malformed value stops start-up with one sentence naming the variable, never a traceback.
With DATABASE_URL / REDIS_URL unset, the embedded PostgreSQL and Redis that
`manage.py standalone` starts in the data folder are used (see infraops/embedded.py).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import environ
import plotly

BASE_DIR = Path(__file__).resolve().parent.parent


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
    config["CONN_MAX_AGE"] = 60
    config["CONN_HEALTH_CHECKS"] = True
    config.setdefault("OPTIONS", {})["connect_timeout"] = 10
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


try:
    DATA_DIR = Path(_read("INFRAOPS_DATA", "str", str(BASE_DIR / ".infraops"))).resolve()
    DEBUG = _read("DEBUG", "bool", False)
    SECRET_KEY = _read("SECRET_KEY", "str", "")
    ALLOWED_HOSTS = _read("ALLOWED_HOSTS", "list", ["localhost", "127.0.0.1", "[::1]"])
    CSRF_TRUSTED_ORIGINS = _read("CSRF_TRUSTED_ORIGINS", "list", [])
    DATABASES = {"default": _database(_read("DATABASE_URL", "str", ""), DATA_DIR)}
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
    if not SECRET_KEY:
        # `manage.py standalone` keeps a generated key in the data folder; production sets one.
        key_file = DATA_DIR / "secret_key"
        SECRET_KEY = key_file.read_text().strip() if key_file.exists() else ""
    if not SECRET_KEY:
        SECRET_KEY = "django-insecure-infraops-development-key"  # noqa: S105
    if TASK_TIME_LIMIT <= 0:
        raise _ConfigError(f"INFRAOPS_TASK_TIME_LIMIT={TASK_TIME_LIMIT} must be positive.")
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
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "infraops.middleware.LoginRequiredMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
    "infraops.middleware.ContentSecurityPolicyMiddleware",
]

ROOT_URLCONF = "infraops.urls"
ASGI_APPLICATION = "infraops.asgi.application"

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
                "infraops.context_processors.infraops",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "agents:dashboard"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
# plotly.js comes from the plotly package itself, never from a CDN.
STATICFILES_DIRS = [BASE_DIR / "static", ("plotly", Path(plotly.__file__).parent / "package_data")]
STATIC_ROOT = DATA_DIR / "staticfiles"
# Served by WhiteNoise from the finders in DEBUG and tests, from STATIC_ROOT otherwise.
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Security headers. HTTPS-only flags follow INFRAOPS_SECURE (production behind TLS).
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False  # htmx reads no cookie: the token rides in hx-headers on <body>
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
        "CONFIG": {"hosts": [{"address": REDIS_URL}]},
    }
}

# Celery: the reliability rules of ARCHITECTURE.md. A SIGKILLed worker with Celery's
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
# see infraops/celery.py).
CELERY_DB_REUSE_MAX = 1_000_000
CELERY_TASK_DEFAULT_QUEUE = "agent"
CELERY_TASK_ROUTES = {
    "agents.tasks.*": {"queue": "agent"},
    "infraops.tasks.experiment_execute": {"queue": "experiments"},
    # Every installation runs agent workers (runs need them): the reaper goes there.
    "infraops.tasks.experiments_reap": {"queue": "agent"},
    "reviews.tasks.*": {"queue": "agent"},
}
CELERY_BEAT_SCHEDULE = {
    "reap-expired-leases": {"task": "infraops.tasks.experiments_reap", "schedule": 30.0},
    "requeue-stalled-runs": {"task": "agents.tasks.runs_reap", "schedule": 60.0},
    # Finishes merges a killed process left half done, and merges re-verified changes.
    "advance-merges": {"task": "reviews.tasks.changes_reap", "schedule": 15.0},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": "INFO"},
    "loggers": {"django.db.backends": {"level": "WARNING"}, "pgserver": {"level": "WARNING"}},
}
