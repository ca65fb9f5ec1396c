"""`atlas serve`: load a run once and answer over HTTP (JSON API + a web page), with live corpus edits."""

# Lazy imports: the handler imports torch, uvicorn and atlas.serve (fastapi) when it runs, so that
# `atlas --help` and argument errors answer at once.

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import secrets
import socket

from atlas.cli import add_precision_override
from atlas.serve.serve_settings import DEFAULTS, ServeSettings, setting_help

# the options that set a limit of ServeSettings, each named after its field
SIZE_OPTIONS = {
    "max_request_cost": ("--max-request-cost", int, "UNITS"),
    "max_batch_cost": ("--max-batch-cost", int, "UNITS"),
    "max_batch_seconds": ("--max-batch-seconds", float, "SECONDS"),
    "light_request_cost": ("--light-request-cost", int, "UNITS"),
    "max_queue": ("--max-queue", int, "N"),
    "request_timeout_s": ("--request-timeout", float, "SECONDS"),
    "max_batch": ("--max-batch", int, "N"),
    "batch_window_ms": ("--batch-window-ms", float, "MS"),
    "read_timeout_s": ("--read-timeout", float, "SECONDS"),
    "keep_alive_s": ("--keep-alive", float, "SECONDS"),
    "max_connections": ("--max-connections", int, "N"),
    "max_header_bytes": ("--max-header-bytes", int, "BYTES"),
}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `atlas serve` to the `atlas` parser."""
    serve = subparsers.add_parser(
        "serve", help="serve a run over HTTP: ask, search, see the evidence, edit the corpus live (web page at /)"
    )
    serve.add_argument(
        "checkpoint",
        metavar="MODEL",
        help="a run folder, a checkpoint folder, or a reader (a reader folder, 'atlas-reader', a preset) with --index",
    )
    serve.add_argument("overrides", nargs="*", help="dotted overrides, e.g. inference.num_beams=1")
    serve.add_argument("--index", help="index folder to serve and edit (default: the run's; required for a reader)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--allow-edits", action="store_true", help=setting_help("allow_edits"))
    serve.add_argument("--token", default=None, help=setting_help("token"))
    serve.add_argument(
        "--allow-edits-without-token",
        dest="edits_without_token",
        action="store_true",
        help=setting_help("edits_without_token") + " (implies --allow-edits)",
    )
    serve.add_argument(
        "--allowed-host",
        dest="allowed_hosts",
        action="append",
        default=[],
        metavar="NAME",
        help=setting_help("allowed_hosts") + " (repeat for several)",
    )
    serve.add_argument(
        "--allowed-origin",
        dest="allowed_origins",
        action="append",
        default=[],
        metavar="ORIGIN",
        help=setting_help("allowed_origins") + " (repeat for several)",
    )
    for name, (option, kind, metavar) in SIZE_OPTIONS.items():
        serve.add_argument(
            option, dest=name, type=kind, default=getattr(DEFAULTS, name), metavar=metavar, help=setting_help(name)
        )
    serve.add_argument(
        "--no-auto-compact",
        dest="auto_compact",
        action="store_false",
        help="do not compact the index after the edits that leave it due for one (more than "
        "8 corpus segments or 5%% dead rows); `atlas index compact` still does",
    )
    serve.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (default: torch's; 1 is fastest on a busy machine)"
    )
    add_precision_override(serve)
    serve.set_defaults(func=_serve)


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address) binds only this machine's loopback interface."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: loopback only if every address it resolves to is
        try:
            infos = socket.getaddrinfo(host, None)
        except socket.gaierror:
            return False
        return bool(infos) and all(ipaddress.ip_address(info[4][0]).is_loopback for info in infos)


def is_wildcard(host: str) -> bool:
    """Whether `host` binds every address of the machine (0.0.0.0, ::)."""
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return host == ""


def serving_settings(args: argparse.Namespace) -> tuple[ServeSettings, bool]:
    """The settings `atlas serve` runs with, from its options (→ settings, whether the token was made up here).

    The token: --token, else $ATLAS_TOKEN, else, with --allow-edits, one made up now (printed with the page's
    link). `ValueError` for --allow-edits-without-token on an address beyond loopback, and for a --host that
    binds every address with no --allowed-host (requests would name hosts the server does not know)."""
    allow_edits = args.allow_edits or args.edits_without_token
    token = args.token or os.environ.get("ATLAS_TOKEN") or None
    made_up = False
    if args.edits_without_token:
        if not is_loopback(args.host):
            raise ValueError(
                f"--allow-edits-without-token on {args.host} (not a loopback address): anyone who reaches it could "
                "edit; edits beyond this machine need a token (--token or ATLAS_TOKEN)"
            )
        token = None
    elif allow_edits and token is None:
        token, made_up = secrets.token_urlsafe(24), True
    hosts = list(args.allowed_hosts)
    if is_wildcard(args.host) and not hosts:
        raise ValueError(
            f"--host {args.host} takes connections on every address: name the host names clients will use "
            "with --allowed-host NAME (repeatable; '*' for any, which DNS rebinding can exploit)"
        )
    if not is_wildcard(args.host):
        hosts.append(args.host)
    options = {name: getattr(args, name) for name in SIZE_OPTIONS}
    settings = ServeSettings(
        allow_edits=allow_edits,
        token=token,
        edits_without_token=args.edits_without_token,
        allowed_hosts=tuple(dict.fromkeys([*DEFAULTS.allowed_hosts, *hosts])),
        allowed_origins=tuple(args.allowed_origins),
        **options,
    )
    return settings, made_up


def _serve(args: argparse.Namespace) -> int:
    import torch
    import uvicorn

    from atlas.api import Atlas
    from atlas.loading import resolve_source
    from atlas.serve import AtlasService, create_app, uvicorn_config

    settings, made_up = serving_settings(args)  # before the slow load
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    if resolve_source(args.checkpoint).kind != "checkpoint" and not args.index:
        raise ValueError(
            f"{args.checkpoint} is a reader, not a run: it has no index of its own; give --index IDX "
            "(an index folder made by `atlas index build`)"
        )
    overrides = [*args.overrides, *([f"retriever.precision={args.precision}"] if args.precision else [])]
    model = Atlas.from_pretrained(args.checkpoint, index=args.index, overrides=overrides, verbose=args.verbose)
    service = AtlasService(model, auto_compact=args.auto_compact)
    folder = model.source.path
    app = create_app(service, settings)
    index = service.index
    url = f"http://{'localhost' if is_wildcard(args.host) else args.host}:{args.port}/"
    if not settings.allow_edits:
        edits = "edits off"
    elif settings.token is None:
        edits = "edits on, without a token, from this machine only"
    elif made_up:
        edits = f"edits on with the token {settings.token}; the page edits when opened as {url}#token={settings.token}"
    else:
        edits = "edits on with the token given (--token or ATLAS_TOKEN)"
    print(
        f"atlas serve: {folder} with {len(index)} passages ({index.manifest.spec}) from {index.folder}; "
        f"{url} ({edits})",
        flush=True,
    )
    try:
        uvicorn.Server(uvicorn_config(app, settings, host=args.host, port=args.port, log_level="warning")).run()
    finally:
        service.close()
    return 0
