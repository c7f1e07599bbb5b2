"""Settings of the example project; everything a deployment changes comes from the environment.

The database is SQLite in the project folder unless ``DATABASE_URL`` names a
PostgreSQL database (``postgres://user:password@host:5432/name``). Every
zkbeat setting is listed below with what it does.
"""

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_float(name: str) -> float | None:
    value = os.environ.get(name, "").strip()
    return float(value) if value else None


def _database(url: str) -> dict:
    """``DATABASE_URL`` as a Django database; SQLite when it is empty."""
    if not url:
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("PROJ_SQLITE_PATH") or BASE_DIR / "db.sqlite3",
            # Beat's leader and the workers write at the same time; wait for the lock.
            "OPTIONS": {"timeout": 30},
        }
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ImproperlyConfigured(f"DATABASE_URL: only postgres:// is supported, got {parts.scheme}://")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "example-only-not-secret")
DEBUG = os.environ.get("DJANGO_DEBUG", "1") == "1"
ALLOWED_HOSTS = os.environ.get("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost").split(",")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_celery_beat",
    # zkbeat's view in the admin (after django_celery_beat): last and next runs, pauses,
    # pause/resume/run-now actions, and a cluster page (docs/django.md).
    "zkbeat.contrib.admin",
    "jobs",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "proj.urls"
WSGI_APPLICATION = "proj.wsgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

DATABASES = {"default": _database(os.environ.get("DATABASE_URL", ""))}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "static"

# How long the jobs keep things (jobs/tasks.py).
JOBS_MESSAGE_RETENTION_DAYS = 30

# --- Celery ----------------------------------------------------------------

CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TIMEZONE = TIME_ZONE
# `celery -A proj beat` uses this without --scheduler.
CELERY_BEAT_SCHEDULER = "zkbeat.DatabaseScheduler"
# How often the beat leader checks the tables for changes made in the admin.
CELERY_BEAT_MAX_LOOP_INTERVAL = 5

# The periodic jobs. The beat leader copies them into django-celery-beat's
# tables, where operators can change them in the admin; broadcasts are one-off
# tasks created with each Broadcast (jobs/models.py). PROJ_FAST_SCHEDULE=1
# runs every job every few seconds, for `make demo` and failover by hand.
if os.environ.get("PROJ_FAST_SCHEDULE") == "1":
    CELERY_BEAT_SCHEDULE = {
        "cleanup-messages": {"task": "jobs.cleanup_messages", "schedule": 2.0},
        "aggregate-analytics": {"task": "jobs.aggregate_analytics", "schedule": 3.0},
        "expire-sessions": {"task": "jobs.expire_sessions", "schedule": 5.0},
    }
else:
    CELERY_BEAT_SCHEDULE = {
        "cleanup-messages": {"task": "jobs.cleanup_messages", "schedule": crontab(minute=30, hour=3)},
        "aggregate-analytics": {"task": "jobs.aggregate_analytics", "schedule": crontab(minute="*/15")},
        "expire-sessions": {"task": "jobs.expire_sessions", "schedule": 3600.0},
    }

# --- zkbeat: every setting it reads --------------------------------------
# Celery reads CELERY_ZKBEAT_X as zkbeat_x. None means "zkbeat's default".

# ZooKeeper connect string, chroot allowed: "zk1:2181,zk2:2181,zk3:2181/apps".
# None: the ZKBEAT_HOSTS environment variable, else 127.0.0.1:2181.
CELERY_ZKBEAT_HOSTS = os.environ.get("ZKBEAT_HOSTS") or None
# Base znode of this app's election and ledger. None: /zkbeat/<app.main>, here /zkbeat/proj.
CELERY_ZKBEAT_ROOT = os.environ.get("ZKBEAT_ROOT") or None
# ZooKeeper session timeout in seconds. A crashed leader is replaced after about
# this long; a graceful stop (SIGTERM) hands over at once whatever it is.
CELERY_ZKBEAT_SESSION_TIMEOUT = _env_float("ZKBEAT_SESSION_TIMEOUT") or 10.0
# This replica's name in logs and `zkbeat status`. None: <hostname>:<pid>.
CELERY_ZKBEAT_IDENTITY = os.environ.get("ZKBEAT_IDENTITY") or None
# A tick later than this many seconds (a long outage) is skipped and logged, not
# run late. None: run it once, late (Celery's own rule). django-celery-beat's
# tables have no field for a per-task value, so here it is one for all.
CELERY_ZKBEAT_MISFIRE_GRACE_TIME = _env_float("ZKBEAT_MISFIRE_GRACE_TIME")
# What a leader does with ticks missed during an outage, a failover or a pause:
# "once" (run them as one, Celery's rule), "skip", or "all" (each slot once, in order).
CELERY_ZKBEAT_CATCHUP = os.environ.get("ZKBEAT_CATCHUP", "once")
# With "all": the most missed slots published; past it none runs, and the log says why.
CELERY_ZKBEAT_CATCHUP_LIMIT = int(os.environ.get("ZKBEAT_CATCHUP_LIMIT", "100"))
# Seconds of jitter: each tick is published up to this much after its slot, the same
# offset on every replica (a hash of the entry and slot). 0: at the slot.
CELERY_ZKBEAT_JITTER = _env_float("ZKBEAT_JITTER") or 0
# ZooKeeper digest auth "user:password": zkbeat authenticates and gives its znodes
# an ACL for that user only. None: no auth (open ACL).
CELERY_ZKBEAT_AUTH = [("digest", os.environ["ZKBEAT_DIGEST"])] if os.environ.get("ZKBEAT_DIGEST") else None
# TLS to ZooKeeper (its secureClientPort) instead of plain TCP.
CELERY_ZKBEAT_USE_SSL = os.environ.get("ZKBEAT_USE_SSL", "0") in ("1", "true", "yes")
# With TLS: the CA file that signed ZooKeeper's certificate.
CELERY_ZKBEAT_SSL_CA = os.environ.get("ZKBEAT_SSL_CA") or None
# With TLS: this client's certificate file, if ZooKeeper asks for one.
CELERY_ZKBEAT_SSL_CERT = os.environ.get("ZKBEAT_SSL_CERT") or None
# With TLS: that certificate's private key file.
CELERY_ZKBEAT_SSL_KEY = os.environ.get("ZKBEAT_SSL_KEY") or None
# Port of Prometheus /metrics and /healthz (probes, `zkbeat health --local`). None: off.
CELERY_ZKBEAT_METRICS_PORT = int(os.environ["ZKBEAT_METRICS_PORT"]) if os.environ.get("ZKBEAT_METRICS_PORT") else None
# Address that port listens on.
CELERY_ZKBEAT_METRICS_ADDRESS = os.environ.get("ZKBEAT_METRICS_ADDRESS", "0.0.0.0")
# A small socket per replica through which the next one sees a crash at once.
CELERY_ZKBEAT_LIVENESS = os.environ.get("ZKBEAT_LIVENESS", "1") in ("1", "true", "yes")
# Where that socket listens (host or host:port); None: the address that reaches ZooKeeper.
CELERY_ZKBEAT_LIVENESS_ADDRESS = os.environ.get("ZKBEAT_LIVENESS_ADDRESS") or None
# Seconds a leader's pass may take before the watchdog steps a hung leader down.
CELERY_ZKBEAT_STALL_TIMEOUT = _env_float("ZKBEAT_STALL_TIMEOUT") or 30.0
# How many of each entry's last runs its ledger znode keeps (0 to 10), shown by
# `zkbeat history` and the dashboard; written by the claim itself. None: 10.
CELERY_ZKBEAT_RECENT_RUNS = None
# Shards the schedule is split into, each with its own leader (docs/sharding.md).
# zkbeat.DatabaseScheduler runs one shard; None: 1.
CELERY_ZKBEAT_SHARDS = None
# Seconds a leader may fail to reach the broker before it hands over to a replica
# that can (in a real broker outage nobody can, and leadership stays). 0: off.
CELERY_ZKBEAT_BROKER_HANDOVER_TIMEOUT = _env_float("ZKBEAT_BROKER_HANDOVER_TIMEOUT") or 15.0
