"""`atlas serve`: load a run once and answer over HTTP (JSON API + a web page), with live corpus edits."""

# Lazy imports: the handler imports torch, uvicorn and atlas.serve (fastapi) when it runs, so that
# `atlas --help` and argument errors answer at once.

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import socket

from retriever.embedding_precision import EMBEDDING_PRECISIONS  # light: the choices only


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
    serve.add_argument(
        "--allow-edits", action="store_true", help="enable adding, updating and removing passages (off by default)"
    )
    serve.add_argument(
        "--token",
        default=None,
        help="bearer token that editing requests must carry (default: $ATLAS_TOKEN); "
        "required with --allow-edits when --host is not a loopback address",
    )
    serve.add_argument("--max-batch", type=int, default=32, help="questions per forward pass (1: no micro-batching)")
    serve.add_argument(
        "--batch-window-ms", type=float, default=5.0, help="how long a batch waits for more questions after its first"
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
    serve.add_argument(
        "--precision",
        choices=EMBEDDING_PRECISIONS,
        default=None,
        help="the precision passages and questions are embedded at (the same as the override "
        "retriever.precision=…): bf16, fp32, or auto: bf16 where the hardware multiplies it natively; default: the "
        "recipe's (auto)",
    )
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


def serving_token(host: str, allow_edits: bool, token: str | None) -> str | None:
    """The token editing requests must carry: --token, else $ATLAS_TOKEN, else none; a
    `ValueError` when edits are allowed beyond loopback without one."""
    token = token or os.environ.get("ATLAS_TOKEN") or None
    if allow_edits and token is None and not is_loopback(host):
        raise ValueError(
            f"--allow-edits on {host} (not a loopback address) needs a token: give --token TOKEN or set ATLAS_TOKEN"
        )
    return token


def _serve(args: argparse.Namespace) -> int:
    import torch
    import uvicorn

    from atlas.api import Atlas
    from atlas.loading import resolve_source
    from atlas.serve import AtlasService, create_app

    token = serving_token(args.host, args.allow_edits, args.token)  # before the slow load
    if args.max_batch < 1:
        raise ValueError(f"--max-batch must be >= 1, got {args.max_batch}")
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
    app = create_app(
        service,
        allow_edits=args.allow_edits,
        token=token,
        max_batch=args.max_batch,
        batch_window_ms=args.batch_window_ms,
    )
    index = service.index
    print(
        f"atlas serve: {folder} with {len(index)} passages ({index.manifest.spec}) from {index.folder}; "
        f"edits {'on' if args.allow_edits else 'off'}; http://{args.host}:{args.port}/ (API docs at /docs)",
        flush=True,
    )
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        service.close()
    return 0
