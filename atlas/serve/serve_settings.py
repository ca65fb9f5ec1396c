"""How `atlas serve` serves: who may edit, what one request may cost, how long a client may take.

`ServeSettings` holds every setting and its default, once: `create_app` reads it, the uvicorn
connection layer (connections.py) reads it, `atlas serve`'s options are made from its fields
(`atlas/cli/serve_command.py`: each field's `help` is the option's), and /api/info reports it.

The cost of a question is counted before any model work: each passage it reads (k of them) costs
one unit per started block of `QUESTION_BLOCK_CHARS` characters of the question (the reader reads
the question again beside every passage), so a question of up to 200 characters reading 5
passages costs 5, one of 2,000 characters reading 20 costs 200. A request whose questions cost
more than `max_request_cost` together is refused (413) before it is queued. A micro-batch holds at
most `max_batch_cost`, and a light request (costing at most `light_request_cost`) is batched with light ones
only, ahead of heavier ones: its question waits at most for the batch already running, however heavy the requests
queued beside it (those are sliced across batches, one question of each in turn).
"""

from __future__ import annotations

import ipaddress
import math
import re
from dataclasses import dataclass, field, fields

QUESTION_BLOCK_CHARS = 200  # characters of a question that cost one unit per passage read
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "::1")  # the names a loopback client reaches this machine by
MIN_TOKEN_CHARS = 16
TOKEN_RULE = (
    f"a token is at least {MIN_TOKEN_CHARS} printable ASCII characters (space to '~'), with no space first or last"
)
# A Host header: a name (letters, digits, '.', '-', '_', '~') or a bracketed IPv6 address (a zone too), then
# nothing or ':port'. Anything after the bracket but a port makes it no host at all, so `[::1]evil` is not ::1.
_HOST = re.compile(r"(?:\[(?P<v6>[0-9A-Za-z:.%]+)\]|(?P<name>[0-9A-Za-z._~-]+))(?::[0-9]*)?")


def question_cost(question: str, k: int) -> int:
    """Units of reading one question costs: k passages × started blocks of QUESTION_BLOCK_CHARS characters."""
    return k * max(1, math.ceil(len(question) / QUESTION_BLOCK_CHARS))


def host_name(host: str) -> str | None:
    """The host a Host header names (`name`, `name:port`, `[v6]`, `[v6]:port` → name or v6), or None when it is
    not of these forms."""
    match = _HOST.fullmatch(host)
    return None if match is None else match["v6"] or match["name"]


def token_problem(token: str) -> str | None:
    """What makes `token` one that `Authorization: Bearer` cannot carry or that is too short, or None."""
    if len(token) < MIN_TOKEN_CHARS:
        return f"the token has {len(token)} characters"
    beyond = next((n for n, c in enumerate(token) if not " " <= c <= "~"), None)
    if beyond is not None:
        return f"character {beyond + 1} of the token is not printable ASCII"
    if token != token.strip(" "):
        return "the token starts or ends with a space"
    return None


def is_loopback_address(address: str) -> bool:
    """Whether `address` (an IP address as a string, as a client's is reported) is a loopback one."""
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def _option(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class ServeSettings:
    """Every setting of `atlas serve` and its default (each field's `help` is its `atlas serve` option's)."""

    # ---------------------------------------------------------------- who may edit
    allow_edits: bool = _option(False, "enable adding, updating and removing passages (off by default)")
    token: str | None = _option(
        None,
        "bearer token that editing requests must carry (`Authorization: Bearer TOKEN`; at least "
        f"{MIN_TOKEN_CHARS} printable ASCII characters, no space first or last; default: $ATLAS_TOKEN, else "
        "`atlas serve --allow-edits` makes one up and prints the page's link with it)",
    )
    edits_without_token: bool = _option(
        False,
        "take edits with no token, from loopback clients only (--host must be a loopback address): any "
        "program or user on this machine can then edit the corpus",
    )
    allowed_hosts: tuple[str, ...] = _option(
        LOOPBACK_HOSTS,
        "host names a request's Host header may name (beside the loopback ones and --host); '*': any",
    )
    allowed_origins: tuple[str, ...] = _option(
        (),
        "origins (scheme://host:port) whose pages may call the API, beside the server's own",
    )
    # ---------------------------------------------------------------- what one request may cost
    max_request_cost: int = _option(
        640,
        "the most reading one request may cost: k passages per question, times its length in started blocks "
        f"of {QUESTION_BLOCK_CHARS} characters, summed over its questions",
    )
    max_batch_cost: int = _option(
        80,
        "the most reading one micro-batch may cost (as --max-request-cost counts it; 80: 16 short questions at "
        "k=5): what a light request may wait for",
    )
    max_batch_seconds: float = _option(
        2.0,
        "the most time of reading a micro-batch of heavy requests may hold, at the model's measured pace (one "
        "question at least): what a light request may wait for, on a slow machine too",
    )
    light_request_cost: int = _option(
        10,
        "a request costing at most this (its questions together; 10: one question of up to 200 characters at "
        "k <= 10) is light: while one waits, the next micro-batch holds light requests only, so it waits for the "
        "batch already running, never beside a heavy request's questions",
    )
    max_queue: int = _option(
        256, "questions waiting for the model at most; beyond it a request is answered 503 with Retry-After"
    )
    request_timeout_s: float = _option(60.0, "seconds a question or search may wait and run before it is answered 504")
    max_batch: int = _option(32, "questions per forward pass (1: no micro-batching)")
    batch_window_ms: float = _option(5.0, "how long a batch waits for more questions after its first")
    # ---------------------------------------------------------------- how long a client may take
    read_timeout_s: float = _option(
        10.0,
        "seconds a client has to send a whole request (headers and body) from the moment its connection "
        "opens or its previous response ends; a slower one is disconnected",
    )
    keep_alive_s: float = _option(5.0, "seconds an idle keep-alive connection stays open")
    max_connections: int = _option(
        64, "open connections at most; a request on one more is answered 503 and the connection closed"
    )
    max_header_bytes: int = _option(
        16_384, "bytes of request line and headers at most; a request with more is answered 431"
    )

    def __post_init__(self):
        for name in (
            "max_request_cost",
            "max_batch_cost",
            "light_request_cost",
            "max_queue",
            "max_batch",
            "max_connections",
            "max_header_bytes",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("request_timeout_s", "read_timeout_s", "keep_alive_s", "max_batch_seconds"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.batch_window_ms < 0:
            raise ValueError(f"batch_window_ms must be >= 0, got {self.batch_window_ms}")
        if self.allow_edits and self.token is None and not self.edits_without_token:
            raise ValueError(
                "edits need a token: give token=... (atlas serve: --token or ATLAS_TOKEN), or opt out with "
                "edits_without_token=True (--allow-edits-without-token), which takes edits from loopback clients only"
            )
        if self.token is not None and (problem := token_problem(self.token)) is not None:
            # a token a header cannot carry as given (h11 strips the spaces around a value) would match no request
            raise ValueError(f"{TOKEN_RULE}: {problem} (--token or ATLAS_TOKEN)")

    def host_allowed(self, host: str) -> bool:
        """Whether a request's Host header (`name`, `name:port`, `[v6]`, `[v6]:port`) names this server."""
        if "*" in self.allowed_hosts:
            return True
        name = host_name(host)
        return name is not None and name.lower() in {h.lower() for h in (*LOOPBACK_HOSTS, *self.allowed_hosts)}

    def public(self) -> dict:
        """What /api/info reports: every setting but the token (only whether there is one)."""
        shown = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("token", "allow_edits")}
        return {"edits_allowed": self.allow_edits, "token_required": self.token is not None, **shown}


def setting_help(name: str) -> str:
    """The `help` of a ServeSettings field (the text of its `atlas serve` option)."""
    return next(f.metadata["help"] for f in fields(ServeSettings) if f.name == name)


DEFAULTS = ServeSettings()
