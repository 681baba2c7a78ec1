"""The one settings module. Everything that differs between machines comes from the environment
through the typed helpers in console.env, which refuse bad values."""

from __future__ import annotations

import warnings
from pathlib import Path

from console.env import (
    EnvError,
    database_from_url,
    env_bool,
    env_choice,
    env_int,
    env_list,
    env_str,
)

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("CONSOLE_VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DEBUG", True)
_INSECURE_DEV_KEY = "dev-only-insecure-key-do-not-use-in-production-0123456789abcdef"
SECRET_KEY = env_str("SECRET_KEY", _INSECURE_DEV_KEY if DEBUG else None)
if not DEBUG and SECRET_KEY == _INSECURE_DEV_KEY:
    raise EnvError("SECRET_KEY must be set to a real secret when DEBUG is off")

# Off DEBUG there is no safe guess for the public host names: they must be given.
_LOCAL_HOSTS = ["127.0.0.1", "localhost", "testserver"]
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", _LOCAL_HOSTS if DEBUG else None)
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "django_htmx",
    # So /api/docs renders ninja's template that loads the Swagger UI it ships (served with
    # our static files) instead of its fallback that loads it from a CDN: offline it was blank.
    "ninja",
    "template_partials",
    # The project package itself, for its management commands (seed_demo).
    "console",
    "console.accounts",
    "console.audit",
    "console.registry",
    "console.status",
    "console.runs",
    "console.scheduling",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_htmx.middleware.HtmxMiddleware",
]

ROOT_URLCONF = "console.urls"
ASGI_APPLICATION = "console.asgi.application"
WSGI_APPLICATION = "console.wsgi.application"

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
                "console.accounts.context.team_context",
            ],
        },
    }
]

# PostgreSQL only. With no DATABASE_URL, `python -m console.devservers` starts a private server
# under var/ and exports DATABASE_URL for the processes it launches.
DATABASE_URL = env_str("DATABASE_URL", "postgresql://postgres@/console?host=" + str(VAR_DIR / "pg"))
DATABASES = {"default": database_from_url(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env_str("REDIS_URL", "redis+socket://" + str(VAR_DIR / "redis" / "redis.sock"))


def _channel_layer_address(url: str) -> str:
    # channels-redis speaks redis:// and unix:// ; our socket form is redis+socket:///path
    if url.startswith("redis+socket://"):
        return "unix://" + url.removeprefix("redis+socket://")
    return url


def _channel_layer_host(url: str) -> dict[str, object]:
    host: dict[str, object] = {
        "address": _channel_layer_address(url),
        "socket_timeout": None,
        "socket_connect_timeout": 5,
    }
    if not url.startswith("redis+socket://"):
        host["socket_keepalive"] = True  # a TCP option (a Unix socket's connection refuses it)
    return host


CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # A page's channel holds up to 1,000 waiting messages (the default 100 filled up with
        # 50 pages open on a run at 100 doorbells a second); past it, doorbells are dropped,
        # which the live stream survives (the next one reads everything since the cursors).
        # No socket timeout (redis-py's default is 5 s), for two reasons. A receive is a
        # blocking pop that Redis answers within 5 s, empty or not: a 5 s read timeout fired
        # on a loaded server and closed pages' sockets. And with any socket timeout redis-py
        # sends each command through asyncio.wait_for, which in Python 3.11 loses a
        # cancellation landing as the send completes: a page's receive cancelled then pops
        # again forever (or until a read timeout). A Redis that goes away closes the socket,
        # which fails the read; over TCP, keepalive notices a peer that vanished silently.
        # Connecting keeps a timeout.
        "CONFIG": {"hosts": [_channel_layer_host(REDIS_URL)], "capacity": 1000},
    }
}

# The status page re-probes every part this often while someone has it open.
STATUS_PROBE_INTERVAL_S = env_int("STATUS_PROBE_INTERVAL_S", 3, minimum=1)

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_DEFAULT_QUEUE = "control"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# The control worker (`celery worker -Q control -B`) sweeps hosts and the queue this often.
CELERY_BEAT_SCHEDULE = {
    "runs-sweep": {"task": "runs.sweep", "schedule": float(env_int("RUNS_SWEEP_S", 5, minimum=1))}
}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

# Runs. Paths every host must read: models' weights and runs' checkpoints (a shared filesystem
# when hosts are several machines).
MODELS_ROOT = Path(env_str("MODELS_ROOT", str(VAR_DIR / "models")))
RUNS_ROOT = Path(env_str("RUNS_ROOT", str(VAR_DIR / "runs")))
# A host agent writes its heartbeat this often; the sweep marks a host offline (and re-queues
# its attempts from their last checkpoint) when its heartbeat is older than HOST_OFFLINE_AFTER_S.
HOST_HEARTBEAT_S = env_int("HOST_HEARTBEAT_S", 2, minimum=1)
HOST_OFFLINE_AFTER_S = env_int("HOST_OFFLINE_AFTER_S", 20, minimum=2)
# Attempts a host without GPUs runs at once (a host with GPUs offers one slot per GPU).
HOST_CPU_SLOTS = env_int("HOST_CPU_SLOTS", 1, minimum=0)
# The most of a job's stdout/stderr kept per attempt (its first 64 KiB and its newest part).
RUN_LOG_MAX_BYTES = env_int("RUN_LOG_MAX_BYTES", 1024 * 1024, minimum=128 * 1024)
# After a cancel is delivered, the agent stops a job that is still running this much later.
RUN_CANCEL_GRACE_S = env_int("RUN_CANCEL_GRACE_S", 60, minimum=1)
# The scheduler: a preemption request nobody decided expires after PREEMPTION_REQUEST_EXPIRE_S;
# a requester whose request was rejected or expired is not asked for again for
# PREEMPTION_REFILE_AFTER_S (an admin's "no" is not re-asked on the next pass).
PREEMPTION_REQUEST_EXPIRE_S = env_int("PREEMPTION_REQUEST_EXPIRE_S", 1800, minimum=1)
PREEMPTION_REFILE_AFTER_S = env_int("PREEMPTION_REFILE_AFTER_S", 900, minimum=0)
# A run whose job dies without reporting (a signal, the OOM killer) is resumed from its last
# checkpoint; after this many deaths it fails instead.
RUN_MAX_ATTEMPTS = env_int("RUN_MAX_ATTEMPTS", 3, minimum=1)
# Runs on several hosts (gangs). A host agent registers HOST_ADDRESS: the address its peers'
# ranks reach it at when its host holds a gang's node 0 (the rendezvous). Each gang attempt takes
# one port of RUNS_RENDEZVOUS_PORT_FIRST .. +COUNT-1 on its node-0 host while it runs.
# RUNS_DIST_BACKEND: torch.distributed's backend for jobs ("auto": nccl with CUDA, gloo without).
HOST_ADDRESS = env_str("HOST_ADDRESS", "127.0.0.1")
RUNS_RENDEZVOUS_PORT_FIRST = env_int("RUNS_RENDEZVOUS_PORT_FIRST", 29500, minimum=1024)
RUNS_RENDEZVOUS_PORT_COUNT = env_int("RUNS_RENDEZVOUS_PORT_COUNT", 200, minimum=1)
if RUNS_RENDEZVOUS_PORT_FIRST + RUNS_RENDEZVOUS_PORT_COUNT > 65536:
    raise EnvError("RUNS_RENDEZVOUS_PORT_FIRST + RUNS_RENDEZVOUS_PORT_COUNT must be at most 65536")
RUNS_DIST_BACKEND = env_choice("RUNS_DIST_BACKEND", "auto", {"auto", "gloo", "nccl"})
# A callable `(attempt, control) -> Control` (dotted path) that a job's rank 0 reads its
# decisions through, wrapped around the console's own Control; empty: the console's alone. The
# cluster tests hold a run at a known step with one (tests/console/runs_hold.py), so that a fast
# machine cannot end a run before the test acted on it.
RUNS_CONTROL_WRAPPER = env_str("RUNS_CONTROL_WRAPPER", "")

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_URL = "/accounts/login/"
# Every password check goes through the login throttle (console.accounts.throttle).
AUTHENTICATION_BACKENDS = ["console.accounts.throttle.ThrottledModelBackend"]
LOGIN_THROTTLE_WINDOW_S = env_int("LOGIN_THROTTLE_WINDOW_S", 15 * 60, minimum=1)
LOGIN_FAILURES_PER_ACCOUNT = env_int("LOGIN_FAILURES_PER_ACCOUNT", 5, minimum=1)
LOGIN_FAILURES_PER_ADDRESS = env_int("LOGIN_FAILURES_PER_ADDRESS", 20, minimum=1)
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"
        if not DEBUG
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
MEDIA_ROOT = VAR_DIR / "media"
# In DEBUG WhiteNoise serves from the finders; it still warns that collectstatic never ran.
warnings.filterwarnings("ignore", message="No directory at", module="whitenoise.base")

# Uploads: task sets stream through a temporary file; nothing is held whole in memory.
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
DATA_UPLOAD_MAX_MEMORY_SIZE = 10 * 1024 * 1024
TASKSET_MAX_UPLOAD_BYTES = env_int("TASKSET_MAX_UPLOAD_BYTES", 512 * 1024 * 1024, minimum=1)
TASKSET_MAX_LINE_BYTES = env_int("TASKSET_MAX_LINE_BYTES", 1024 * 1024, minimum=1)
# Rubrics may call installed reward functions (`python_function`) only from this list of
# dotted paths, "package.module:function" (comma-separated in the environment). Anything else
# a user names is refused when the rubric is saved: code users write goes in
# `sandboxed_function`, which runs only in a sandbox.
TRUSTED_REWARD_FUNCTIONS = env_list("TRUSTED_REWARD_FUNCTIONS", [])
# "Try it on a sample" scores in a child process (console.registry.scoring) with these limits.
TRY_SAMPLE_TIMEOUT_S = env_int("TRY_SAMPLE_TIMEOUT_S", 60, minimum=1)
TRY_SAMPLE_MEMORY_BYTES = env_int("TRY_SAMPLE_MEMORY_BYTES", 4 * 1024**3, minimum=256 * 1024**2)
# `/metrics` (Prometheus text format) answers only a scraper that sends this bearer token;
# unset, the page does not exist.
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
# The most rows one API list answer holds (?limit= above it is a 422).
API_MAX_PAGE_SIZE = env_int("API_MAX_PAGE_SIZE", 500, minimum=1)

SESSION_COOKIE_SECURE = not DEBUG
CSRF_COOKIE_SECURE = not DEBUG
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", not DEBUG)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0 if DEBUG else 31536000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = not DEBUG
SECURE_HSTS_PRELOAD = not DEBUG
# Only behind a proxy that sets (and strips client-sent) X-Forwarded-Proto may it be trusted.
if env_bool("TRUST_X_FORWARDED_PROTO", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

LOG_LEVEL = env_choice("LOG_LEVEL", "INFO", {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"})
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": LOG_LEVEL},
}
