"""Settings for hordeops, every one read from an environment variable.

The names and defaults of the horde's own rules are listed in docs/reference/settings.md.
Nothing outside this module, `hordeops.settings_connections` (where PostgreSQL and Redis are)
and their helpers (`hordeops.env`) reads the environment.
"""

from pathlib import Path

from celery.schedules import schedule
from kombu import Queue

from hordeops.env import (
    env_bool,
    env_deadline_max_ms,
    env_float,
    env_gc_thresholds,
    env_int,
    env_list,
    env_networks,
    env_optional_int,
    env_proxy_ssl_header,
    env_route_limits,
    env_secret_key,
    env_str,
)

# DATABASE_URL, REDIS_URL and Sentinel, DATABASES, CACHES, CELERY_BROKER_URL and the pool's bounds.
from hordeops.settings_connections import *  # noqa: F403

# OAuth's providers, each on when its client id and secret are set (front/oauth.py).
from hordeops.settings_sign_in import *  # noqa: F403
from hordeops.settings_sign_in import SIGN_IN_APPS

BASE_DIR = Path(__file__).resolve().parent.parent


# --- The horde's rules (docs/reference/settings.md) ------------------------------------
TEXT_JOB_LEASE_SECONDS = env_int("TEXT_JOB_LEASE_SECONDS", 150)
TEXT_JOB_PREPARATION_SECONDS = env_int("TEXT_JOB_PREPARATION_SECONDS", 30)
TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS = env_int("TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS", 600)
UNTRUSTED_TEXT_JOB_LEASE_CAP_SECONDS = env_int("UNTRUSTED_TEXT_JOB_LEASE_CAP_SECONDS", 200)
UNMEASURED_TEXT_WORKER_TOKENS_PER_SECOND = env_int("UNMEASURED_TEXT_WORKER_TOKENS_PER_SECOND", 10)
# The most one completed job counts towards a worker's speed, however soon it is submitted
# (jobs/claims.py): a worker cannot buy the speed gate's first tier by handing jobs in at once.
TEXT_WORKER_MAX_TOKENS_PER_SECOND = env_int("TEXT_WORKER_MAX_TOKENS_PER_SECOND", 500)
# An empty pop's `skipped` counts are reused for this long per worker and web process (0: counted
# at every empty pop): jobs/services/pop.py RecentSkips.
POP_SKIPPED_CACHE_SECONDS = env_int("POP_SKIPPED_CACHE_SECONDS", 10)
# The next turn of a conversation is offered to the worker that served the last one for this
# long, if it is free (jobs/affinity.py); 0 turns it off. Conversations are remembered for
# WARM_WORKER_MEMORY_SECONDS after their last turn.
WARM_WORKER_SECONDS = env_float("WARM_WORKER_SECONDS", 2.0)
WARM_WORKER_MEMORY_SECONDS = env_int("WARM_WORKER_MEMORY_SECONDS", 600)
# The bridges (a worker's `bridge_agent` is `name:version:url`) whose output the horde vouches
# for: the AI Horde's list (`horde/bridge_reference.py` LLM_VALIDATED_BACKENDS) and this horde's
# own bridge. Only they serve a request with `validated_backends`, and others earn 30% kudos.
VALIDATED_BRIDGE_AGENTS = env_list(
    "VALIDATED_BRIDGE_AGENTS",
    (
        "AI Horde Worker",
        "AI Horde Worker~aphrodite~oai",
        "AI Horde Worker~aphrodite~kai",
        "KoboldCppEmbedWorker",
        "TabbyAPI",
        "hordeops-bridge",
    ),
)
STALE_GENERATION_PASS_SECONDS = env_int("STALE_GENERATION_PASS_SECONDS", 60)
WORKER_ONLINE_SECONDS = env_int("WORKER_ONLINE_SECONDS", 300)
# Escrowed kudos past which an account at least a week old becomes trusted; unset: never.
KUDOS_TRUST_THRESHOLD = env_optional_int("KUDOS_TRUST_THRESHOLD")
# How often the kudos pass pays uptime and releases escrow (Celery beat).
KUDOS_PASS_SECONDS = env_int("KUDOS_PASS_SECONDS", 60)
WORKER_ABORT_MAINTENANCE_THRESHOLD = env_int("WORKER_ABORT_MAINTENANCE_THRESHOLD", 20)
TEXT_REQUEST_LIFETIME_SECONDS = env_int("TEXT_REQUEST_LIFETIME_SECONDS", 1200)
TEXT_REQUEST_MAX_RESTARTS = env_int("TEXT_REQUEST_MAX_RESTARTS", 3)
GENERATION_DEADLINE_MAX_MS = env_deadline_max_ms("GENERATION_DEADLINE_MAX_MS", 300000)
GENERATION_DEADLINE_ROUTE_LIMITS_MS = env_route_limits("GENERATION_DEADLINE_ROUTE_LIMITS_MS")
INTERNAL_HOP_SECRET = env_str("INTERNAL_HOP_SECRET", "")
ACCOUNT_MAX_WAITING_REQUESTS = env_int("ACCOUNT_MAX_WAITING_REQUESTS", 30)
# Workers one account may run (the AI Horde's limits); a moderator's value on the account wins.
WORKER_LIMIT_UNTRUSTED = env_int("WORKER_LIMIT_UNTRUSTED", 3)
WORKER_LIMIT_TRUSTED = env_int("WORKER_LIMIT_TRUSTED", 20)
# Workers of untrusted accounts, whatever account, from one client address (an IPv6 one by its
# /64); loopback is not limited (the operator's own workers); 0 turns the limit off.
WORKER_LIMIT_PER_ADDRESS = env_int("WORKER_LIMIT_PER_ADDRESS", 3)
# Accounts the sign-up page (/register) makes from one client address (an IPv6 one by its /64) in
# a day; loopback is not limited; 0 turns the limit off.
REGISTRATIONS_PER_ADDRESS = env_int("REGISTRATIONS_PER_ADDRESS", 3)
# The sign-up's proof of work (front/signup.py): the browser tries up to this many numbers, half
# of them on average, to find the one whose SHA-256 the challenge names: about a second in a
# desktop Chromium at 500,000 (250,000 hashes a second).
SIGNUP_CHALLENGE_MAX_NUMBER = env_int("SIGNUP_CHALLENGE_MAX_NUMBER", 500_000)
# Suspicions (workers/suspicion.py) that flag an untrusted account: its workers are offered no
# jobs and it is never trusted automatically (the AI Horde's 5).
SUSPICION_THRESHOLD = env_int("SUSPICION_THRESHOLD", 5)
ANONYMOUS_MAX_WAITING_REQUESTS = env_int("ANONYMOUS_MAX_WAITING_REQUESTS", 10)
# Token buckets of every route but the worker routes, the heartbeat and /metrics
# (hordeops/ratelimit.py): per API key and per client address, each refilling at its rate per
# second up to its burst; a rate of 0 turns that limit off.
KEY_RATE_PER_SECOND = env_int("KEY_RATE_PER_SECOND", 10)
KEY_RATE_BURST = env_int("KEY_RATE_BURST", 30)
ADDRESS_RATE_PER_SECOND = env_int("ADDRESS_RATE_PER_SECOND", 20)
ADDRESS_RATE_BURST = env_int("ADDRESS_RATE_BURST", 60)
# A key that no account has, sent to a worker route, is refused for this long by each web process
# without asking the database again (hordeops/ratelimit.py KeyMemory).
INVALID_KEY_CACHE_SECONDS = env_int("INVALID_KEY_CACHE_SECONDS", 10)
# Failed admin logins (hordeops/logins.py), in a window from the first: past PER_ADDRESS from one
# address it is refused; past PER_USER for one name from one address, that name from there; past
# PER_USER_TOTAL for one name from anywhere, each address gets 2 tries at it. An address that
# has not failed is never refused, so nobody can lock a moderator out.
ADMIN_LOGIN_FAILURES_PER_USER = env_int("ADMIN_LOGIN_FAILURES_PER_USER", 5)
ADMIN_LOGIN_FAILURES_PER_USER_TOTAL = env_int("ADMIN_LOGIN_FAILURES_PER_USER_TOTAL", 100)
ADMIN_LOGIN_FAILURES_PER_ADDRESS = env_int("ADMIN_LOGIN_FAILURES_PER_ADDRESS", 20)
ADMIN_LOGIN_WINDOW_SECONDS = env_int("ADMIN_LOGIN_WINDOW_SECONDS", 900)
# Proxies whose X-Forwarded-For names the client (empty: the connection's peer is the client).
TRUSTED_PROXIES = env_networks("TRUSTED_PROXIES")
# A count made on every pop reaches Redis within this many seconds (0: at once): hordeops/metrics.py.
METRICS_FLUSH_SECONDS = env_float("METRICS_FLUSH_SECONDS", 1.0)
# Webhooks (jobs/webhooks.py): the POST after each generation of a text request that names one.
# Insecure: http hooks and private, loopback or link-local addresses allowed (tests, private
# deployments). Each try is bounded by the timeout as a whole; the tries are this far apart.
WEBHOOK_ALLOW_INSECURE = env_bool("WEBHOOK_ALLOW_INSECURE", False)
WEBHOOK_TIMEOUT_SECONDS = env_float("WEBHOOK_TIMEOUT_SECONDS", 3.0)
WEBHOOK_RETRY_SECONDS = env_float("WEBHOOK_RETRY_SECONDS", 3.0)
# The Celery queue the deliveries wait in, and how many may wait there before more are dropped.
WEBHOOK_QUEUE = env_str("WEBHOOK_QUEUE", "webhooks")
WEBHOOK_QUEUE_MAX = env_int("WEBHOOK_QUEUE_MAX", 10000)

# Where the home page's documentation link goes (the repository's README or docs/ as this horde
# publishes them); empty: the page names them without a link.
DOCS_URL = env_str("DOCS_URL", "")
# What `/.well-known/serviceinfo` says this horde is (front/documents.py), as the AI Horde's
# variables of the same names; HORDE_URL empty: the address each request came to.
HORDE_TITLE = env_str("HORDE_TITLE", "hordeops")
HORDE_URL = env_str("HORDE_URL", "").rstrip("/")
HORDE_REPOSITORY = env_str("HORDE_REPOSITORY", "")
HORDE_LOGO = env_str("HORDE_LOGO", "")

# --- Django ----------------------------------------------------------------------------
DEBUG = env_bool("DJANGO_DEBUG", False)
SECRET_KEY_FILE = Path(env_str("SECRET_KEY_FILE", str(BASE_DIR / "run" / "secret_key")))
SECRET_KEY = env_secret_key("SECRET_KEY", SECRET_KEY_FILE)
# Threads per web process that run sync views (the horde routes, the admin): hordeops/asgi.py.
WEB_SYNC_THREADS = env_int("WEB_SYNC_THREADS", 2)
# Threads per web process that run the chat routes' database steps (hordeops/asyncdb.py): an
# open stream holds none of them, nor a connection, between steps.
WEB_ASYNC_DB_THREADS = env_int("WEB_ASYNC_DB_THREADS", 2)
# The web processes' garbage collector thresholds (hordeops/web_worker.py settle_gc): Python's
# own but for the middle one (10), so that the objects of requests in flight reach the oldest
# generation a tenth as often, and with them its full passes, which stop every request and
# stream of the process (docs/benchmarks.md, "Settings the benchmarks decided").
WEB_GC_THRESHOLDS = env_gc_thresholds("WEB_GC_THRESHOLDS", (700, 100, 10))
# The host names this horde answers to (comma-separated). Required to serve outside debug: the
# web app refuses to load without it (hordeops/asgi.py), as without SECRET_KEY; manage.py
# commands and Celery, which answer no host, run without it. bin/stack and bin/test give the
# loopback names when it is not set.
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS")

# --- Served over HTTPS (docs/reference/operations.md, "Production checklist") -------------
# A TLS-terminating proxy's header that says the client's scheme (e.g. X-Forwarded-Proto): with it
# set to "https", Django knows the request was secure, and the admin's CSRF origin check passes.
# Set it only behind a proxy that sets that header itself, whatever the client sent.
SECURE_PROXY_SSL_HEADER = env_proxy_ssl_header("SECURE_PROXY_SSL_HEADER")
# Origins (scheme and host) whose unsafe requests the admin accepts besides its own host's.
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS")
# Clients reach this horde over HTTPS: the defaults below follow (secure cookies, redirect, HSTS).
HTTPS = env_bool("HTTPS", False)
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", HTTPS)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", HTTPS)
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", HTTPS)
# A load balancer's health check and a scraper call these over plain HTTP inside the network.
SECURE_REDIRECT_EXEMPT = [r"^api/v2/status/heartbeat$", r"^metrics$"]
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 31_536_000 if HTTPS else 0)
# Domain-wide promises (every subdomain HTTPS; listed in browsers): the operator's to make.
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)

INSTALLED_APPS = [
    # The top floor first: its templates (the admin's, restyled) are found before Django's own.
    "front",
    "front.apps.HordeAdminConfig",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files, served from the static files: no CDN
    "django_prometheus",
    "corsheaders",
    "workers",
    "jobs",
    "kudos",
    *SIGN_IN_APPS,
]

# A public horde's moderators are one password away from its accounts: Django's checks, with
# a longer minimum than its default 8 (create_moderator and the admin's password forms).
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": env_int("MODERATOR_PASSWORD_MIN_LENGTH", 12)},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

MIDDLEWARE = [
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    # Before the limits, so that a browser can read their refusals (413, 429) too.
    "corsheaders.middleware.CorsMiddleware",
    "hordeops.api.BodyLimitMiddleware",
    "hordeops.api.RateLimitMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    # No page may be framed (clickjacking of moderator actions); the API is not framed either.
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
]

# What only the pages use, the admin's and people's (sessions, logins, forms, flash messages):
# a request for an API path (`API_PATHS`) skips these (hordeops/asgi.py): work for nothing on
# every API request.
API_PATHS = ("/api/", "/v1/", "/metrics")
PAGE_ONLY_MIDDLEWARE = (
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "allauth.account.middleware.AccountMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
)

X_FRAME_OPTIONS = "DENY"

# Browsers call the public APIs from pages on any origin, as they call the AI Horde's and hosted
# OpenAI-compatible APIs: their keys travel in headers, never in cookies, so no credentials are
# allowed. Never the admin, /metrics or the schema.
CORS_URLS_REGEX = r"^/((api/v2|v1)/|\.well-known/serviceinfo$)"
# The origins that may call them (comma-separated, as `https://host[:port]`); empty: any origin.
CORS_ALLOWED_ORIGINS = env_list("CORS_ALLOWED_ORIGINS")
CORS_ALLOW_ALL_ORIGINS = not CORS_ALLOWED_ORIGINS
CORS_ALLOW_CREDENTIALS = False
# What the horde's, OpenAI's and Anthropic's clients send from a page (Idempotency-Key: a
# page's kudos transfer made safe to retry).
CORS_ALLOW_HEADERS = (
    "accept",
    "authorization",
    "content-type",
    "user-agent",
    "x-requested-with",
    "apikey",
    "client-agent",
    "x-api-key",
    "anthropic-version",
    "anthropic-beta",
    "anthropic-dangerous-direct-browser-access",
    "openai-organization",
    "openai-project",
    "x-multillm-deadline-ms",
    "idempotency-key",
    "x-stainless-arch",
    "x-stainless-lang",
    "x-stainless-os",
    "x-stainless-package-version",
    "x-stainless-retry-count",
    "x-stainless-runtime",
    "x-stainless-runtime-version",
    "x-stainless-timeout",
    "x-stainless-helper-method",
)
# What a page's client reads of an answer beyond the safelisted headers: when to retry.
CORS_EXPOSE_HEADERS = ("retry-after", "x-should-retry")
CORS_PREFLIGHT_MAX_AGE = 86400
# Where a login goes when its `next` is refused (another site's, say): the admin, the only
# pages there are, not Django's default /accounts/profile/ (a 404 here).
LOGIN_REDIRECT_URL = "admin:index"

ROOT_URLCONF = "hordeops.urls"
ASGI_APPLICATION = "hordeops.asgi.application"
WSGI_APPLICATION = "hordeops.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Bodies over 1 MiB are refused with 413 while they are read (docs/reference/horde_api.md).
MAX_REQUEST_BODY_BYTES = 1024 * 1024
# A body with no new bytes for this long, or not complete this long after its headers, is a 408
# (hordeops/asgi.py): a slow sender cannot hold a connection and a web process's memory.
REQUEST_BODY_STALL_SECONDS = env_int("REQUEST_BODY_STALL_SECONDS", 5)
REQUEST_BODY_SECONDS = env_int("REQUEST_BODY_SECONDS", 30)
# The request line and headers: complete this soon after the connection opens or the head's first
# byte, and at most this large (bin/web: hordeops/web_protocol.py), else 408 or 431 and closed.
REQUEST_HEAD_SECONDS = env_float("REQUEST_HEAD_SECONDS", 10.0)
REQUEST_HEAD_MAX_BYTES = env_int("REQUEST_HEAD_MAX_BYTES", 32 * 1024)
# A chat stream whose requester takes none of its bytes for this long, or whose undelivered
# events pass this many bytes in the web process, ends and its request is cancelled (jobs/relay_hub.py,
# hordeops/asgi.py): a requester that stops reading cannot hold a socket and memory past its job.
STREAM_SEND_TIMEOUT_SECONDS = env_float("STREAM_SEND_TIMEOUT_SECONDS", 30.0)
STREAM_QUEUE_MAX_BYTES = env_int("STREAM_QUEUE_MAX_BYTES", 1024 * 1024)
# Connections one web process holds at most (open streams included); the next is 503 and closed.
WEB_MAX_CONNECTIONS = env_int("WEB_MAX_CONNECTIONS", 10000)
DATA_UPLOAD_MAX_MEMORY_SIZE = MAX_REQUEST_BODY_BYTES

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_PARSER_CLASSES": ["hordeops.parsers.StrictJSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "hordeops.api.horde_exception_handler",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "hordeops",
    "DESCRIPTION": "A broker for crowdsourced text generation in the shape of the AI Horde.",
    "VERSION": "2.5.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # The browsable docs at /api/ (hordeops/urls.py): Swagger UI from the static files, and no
    # request to another host (its default validator is swagger.io's: a badge fetched from there).
    # Not Redoc: drf-spectacular's page of it loads Google's fonts.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
    # A field that refuses "" says so (minLength 1), as the routes refuse it.
    "ENFORCE_NON_BLANK_FIELDS": True,
    "APPEND_COMPONENTS": {
        "securitySchemes": {
            "apikey": {"type": "apiKey", "in": "header", "name": "apikey"},
            "bearer": {"type": "http", "scheme": "bearer"},
            "x-api-key": {"type": "apiKey", "in": "header", "name": "x-api-key"},
        }
    },
    # Each route states its own key (jobs/schema.py): the status routes and the heartbeat need none.
    "PREPROCESSING_HOOKS": ["jobs.schema.add_chat_routes"],
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "jobs.schema.bound_deadline_header",
        "hordeops.serializers.bound_request_strings",
        "workers.schema.add_delete_bodies",
    ],
}

# --- Celery (Redis broker, one beat) ----------------------------------------------------
CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A worker started without -Q takes both: the passes from the default queue, the webhooks from
# theirs, in turn, so that a backlog of slow hooks never keeps a pass waiting behind it.
CELERY_TASK_QUEUES = (Queue("celery", routing_key="celery"), Queue(WEBHOOK_QUEUE, routing_key=WEBHOOK_QUEUE))
CELERY_BEAT_SCHEDULE = {
    "every-pass-abort-stale-generations": {
        "task": "jobs.tasks.abort_stale_generations_task",
        "schedule": schedule(STALE_GENERATION_PASS_SECONDS),
        # A pass missed while workers were down is not worth running late: the next
        # one covers it.
        "options": {"expires": STALE_GENERATION_PASS_SECONDS},
    },
    "every-pass-kudos": {
        "task": "kudos.tasks.kudos_pass_task",
        "schedule": schedule(KUDOS_PASS_SECONDS),
        "options": {"expires": KUDOS_PASS_SECONDS},
    },
    # The address timeouts the routes check live in Redis, which keeps nothing on disk: a
    # minute at most after Redis lost them, they are there again.
    "every-minute-address-timeouts": {
        "task": "workers.tasks.publish_address_timeouts_task",
        "schedule": schedule(60),
        "options": {"expires": 60},
    },
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
    },
    "filters": {
        "expected_outcomes": {"()": "hordeops.logs.ExpectedOutcomes"},
        "refused_host": {"()": "hordeops.logs.RefusedHost"},
    },
    "handlers": {
        "console": {"class": "logging.StreamHandler", "formatter": "plain"},
    },
    "loggers": {
        # Propagated to the root's handler; the filter runs before it.
        "django.request": {"filters": ["expected_outcomes"]},
        "django.security.DisallowedHost": {"filters": ["refused_host"]},
        # httpx logs each request's URL at INFO: a webhook's path and query may hold a secret.
        "httpx": {"level": "WARNING"},
    },
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
}
