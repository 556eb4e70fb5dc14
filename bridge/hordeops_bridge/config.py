"""The bridge's settings: a flag wins over its environment variable, which wins over the YAML
file (`--config`), which wins over what the backend reports, which wins over the default.

Names are the AI Horde worker's where it has one (`horde_url`, `api_key`, `worker_name`,
`max_threads` as `threads`, `kai_url` as `backend_url`), so that a volunteer's habits and
an existing `bridgeData.yaml` carry over.
"""

import argparse
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from hordeops_bridge import __version__

BACKENDS = ("openai", "kobold")
# Where each kind of server listens unless told otherwise: llama-server and KoboldCpp.
DEFAULT_BACKEND_URLS = {"openai": "http://127.0.0.1:8080", "kobold": "http://127.0.0.1:5001"}
# Used when neither the volunteer nor the backend says. The reply: enough for the common
# clients (KoboldAI Lite asks for 768 tokens, OpenAI's SDKs for as many as workers accept),
# within half the context so that a prompt keeps the other half. The context: the AI Horde
# pop's own default, and llama-cpp-python's server's, which does not report its own.
DEFAULT_MAX_LENGTH = 1024
DEFAULT_MAX_CONTEXT_LENGTH = 2048
# How long a pop waits at the horde for a job (`wait_seconds`), so that a job reaches the bridge
# as it is queued rather than at the next pop; the horde waits 30 s at most. A horde that does
# not wait (the AI Horde's) answers at once, and the bridge pops every `pop_interval`.
DEFAULT_POP_WAIT = 20.0
MAX_POP_WAIT = 30.0
# The AI Horde worker's YAML names for ours.
YAML_ALIASES = {"kai_url": "backend_url", "max_threads": "threads", "scribe_name": "worker_name"}


class ConfigError(Exception):
    """A setting is missing or malformed: nothing can be served until it is fixed."""


@dataclass(frozen=True)
class Config:
    api_key: str
    worker_name: str
    horde_url: str = "http://127.0.0.1:8000"
    backend: str = "openai"
    backend_url: str = ""
    backend_api_key: str = ""
    model: str = ""
    threads: int = 1
    max_length: int = 0  # 0: what the backend reports, else DEFAULT_MAX_LENGTH (`default_lengths`)
    max_context_length: int = 0
    progress_tokens: int = 16
    progress_seconds: float = 0.25
    pop_interval: float = 1.0
    pop_wait: float = DEFAULT_POP_WAIT
    maintenance_wait: float = 60.0
    grace_seconds: float = 30.0
    once: bool = False
    verbose: bool = False
    # What the backend can do beyond plain chat, declared at each pop: the horde then offers
    # this worker jobs with tools, and jobs that ask for JSON (`response_format`).
    tools: bool = False
    structured_outputs: bool = False

    @property
    def bridge_agent(self) -> str:
        """The AI Horde's `name:version:url`."""
        return f"hordeops-bridge:{__version__}:unknown"


@dataclass(frozen=True)
class Option:
    name: str
    env: str
    short: str = ""
    kind: type = str
    help: str = ""


OPTIONS = [
    Option("horde_url", "HORDE_URL", "-u", help="the horde's base URL (default http://127.0.0.1:8000)"),
    Option("api_key", "HORDE_API_KEY", "-a", help="the API key of the account that owns the worker"),
    Option("worker_name", "HORDE_WORKER_NAME", "-n", help="the worker's name (its first pop creates it)"),
    Option(
        "backend_url", "BACKEND_URL", help="the model server (default :8080 for openai, :5001 for kobold)"
    ),
    Option("backend", "BACKEND_KIND", help="openai (default) or kobold"),
    Option("backend_api_key", "BACKEND_API_KEY", help="a bearer token for an OpenAI-compatible server"),
    Option("model", "HORDE_MODEL", help="the model name to serve (default: what the backend reports)"),
    Option("threads", "HORDE_THREADS", kind=int, help="jobs served at once (default 1)"),
    Option(
        "max_length",
        "HORDE_MAX_LENGTH",
        kind=int,
        help=f"longest reply, in tokens (default: the backend's limit, else {DEFAULT_MAX_LENGTH} "
        "or half the context, whichever is less)",
    ),
    Option(
        "max_context_length",
        "HORDE_MAX_CONTEXT_LENGTH",
        kind=int,
        help=f"most prompt and reply tokens (default: the backend's, else {DEFAULT_MAX_CONTEXT_LENGTH})",
    ),
    Option("progress_tokens", "HORDE_PROGRESS_TOKENS", kind=int, help="tokens per progress post (16)"),
    Option(
        "progress_seconds", "HORDE_PROGRESS_SECONDS", kind=float, help="most seconds between posts (0.25)"
    ),
    Option("pop_interval", "HORDE_POP_INTERVAL", kind=float, help="least seconds between empty pops (1)"),
    Option(
        "pop_wait",
        "HORDE_POP_WAIT",
        kind=float,
        help=f"seconds a pop waits at the horde for a job ({DEFAULT_POP_WAIT:g}; 0: no wait, at most "
        f"{MAX_POP_WAIT:g})",
    ),
    Option(
        "maintenance_wait",
        "HORDE_MAINTENANCE_WAIT",
        kind=float,
        help="seconds between pops while the worker is in maintenance (60)",
    ),
    Option(
        "grace_seconds", "HORDE_GRACE_SECONDS", kind=float, help="SIGTERM: seconds jobs may finish in (30)"
    ),
    Option(
        "tools",
        "HORDE_TOOLS",
        kind=bool,
        help="the backend answers tool calls (OpenAI `tools`): take jobs that send them",
    ),
    Option(
        "structured_outputs",
        "HORDE_STRUCTURED_OUTPUTS",
        kind=bool,
        help="the backend holds a reply to a JSON schema (`response_format`): take jobs that ask for one",
    ),
]


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hordeops-bridge",
        description="Serve a hordeops horde's text and chat jobs from your own model server.",
        epilog="Each option may also come from its environment variable or the --config YAML file.",
    )
    for option in OPTIONS:
        names = [option.short] if option.short else []
        names.append(f"--{option.name}")
        if option.kind is bool:  # a flag; its variable is true when it says 1, true, yes or on
            parser.add_argument(
                *names, action="store_true", default=None, help=f"{option.help} [{option.env}]"
            )
            continue
        parser.add_argument(*names, type=option.kind, default=None, help=f"{option.help} [{option.env}]")
    parser.add_argument("--config", default=None, help="a YAML file of these options [HORDE_CONFIG]")
    parser.add_argument("--once", action="store_true", default=None, help="serve one job, then exit")
    parser.add_argument("--verbose", action="store_true", default=None, help="log every progress answer")
    parser.add_argument("--version", action="version", version=f"hordeops-bridge {__version__}")
    return parser


def _from_yaml(path: str) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"--config {path}: {exc}") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"--config {path}: not a mapping of option names to values")
    return {YAML_ALIASES.get(key, key): value for key, value in loaded.items()}


def _typed(name: str, value: Any, kind: type) -> Any:
    if kind is bool and isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    try:
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: {value!r} is not a valid {kind.__name__}") from None


def load(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> Config:
    """The configuration from flags, environment and YAML, checked."""
    environ = os.environ if environ is None else environ
    args = vars(parser().parse_args(argv))
    config_file = args.pop("config") or environ.get("HORDE_CONFIG")
    from_file = _from_yaml(config_file) if config_file else {}
    known = {field.name: field for field in fields(Config)}
    unknown = sorted(set(from_file) - set(known))
    if unknown:
        raise ConfigError(f"--config {config_file}: unknown options {', '.join(unknown)}")
    kinds = {option.name: option.kind for option in OPTIONS} | {"once": bool, "verbose": bool}
    values: dict[str, Any] = {}
    for name in known:
        kind = kinds.get(name, str)
        env = next((o.env for o in OPTIONS if o.name == name), None)
        if args.get(name) is not None:
            values[name] = args[name]
        elif env and environ.get(env):
            values[name] = _typed(name, environ[env], kind)
        elif name in from_file and from_file[name] is not None:
            values[name] = _typed(name, from_file[name], kind)
    for required in ("api_key", "worker_name"):
        if not values.get(required):
            option = next(o for o in OPTIONS if o.name == required)
            raise ConfigError(f"--{required} (or {option.env}) is required")
    backend = values.get("backend", "openai")
    if backend not in BACKENDS:
        raise ConfigError(f"--backend must be one of {', '.join(BACKENDS)}, not {backend!r}")
    values.setdefault("backend_url", DEFAULT_BACKEND_URLS[backend])
    if backend == "kobold" and (values.get("tools") or values.get("structured_outputs")):
        raise ConfigError("--tools and --structured_outputs need an OpenAI-compatible backend, not kobold")
    for name in ("threads", "progress_tokens"):
        if values.get(name, 1) < 1:
            raise ConfigError(f"--{name} must be at least 1")
    for name in ("max_length", "max_context_length", "grace_seconds", "pop_interval", "pop_wait"):
        if values.get(name, 0) < 0:
            raise ConfigError(f"--{name} must not be negative")
    if values.get("pop_wait", 0) > MAX_POP_WAIT:
        raise ConfigError(f"--pop_wait must be at most {MAX_POP_WAIT:g}: the horde waits no longer")
    if 0 < values.get("max_context_length", 0) < values.get("max_length", 0):
        # As the horde refuses a request whose reply would not fit its context (TokenOverflow).
        raise ConfigError(
            "--max_length must not be more than --max_context_length: a reply is part of the context"
        )
    return Config(**values)


@dataclass(frozen=True)
class Lengths:
    """What a worker declares at its pop, and where each figure came from (for its log line)."""

    max_length: int
    max_context_length: int
    length_from: str
    context_from: str


def lengths(config: Config, reported_length: int | None, reported_context: int | None) -> Lengths:
    """Each from the volunteer's setting, else what the backend reports, else the default: the
    reply DEFAULT_MAX_LENGTH within half the context. A reply longer than the context could
    never be generated, so it is declared as the context at most (only the backend's can be:
    the settings are checked by `load`)."""
    context, context_from = _first((config.max_context_length, reported_context), DEFAULT_MAX_CONTEXT_LENGTH)
    length, length_from = _first((config.max_length, reported_length), min(DEFAULT_MAX_LENGTH, context // 2))
    if length > context:
        length, length_from = context, f"{length_from}, cut to the context"
    return Lengths(max(length, 1), context, length_from, context_from)


def _first(given: tuple[int | None, int | None], default: int) -> tuple[int, str]:
    setting, reported = given
    if setting:
        return setting, "set"
    if reported:
        return reported, "the backend's"
    return default, "the bridge's default"
