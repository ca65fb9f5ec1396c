"""`atlas serve`: a long-lived HTTP server over a loaded run (API, web page, live corpus edits).

    service = AtlasService(atlas.Atlas.from_pretrained(RUN, index=INDEX))  # answer / search / edit
    app = create_app(service, ServeSettings(allow_edits=True, token=TOKEN))  # atlas.serve.app: FastAPI
    uvicorn.Server(uvicorn_config(app, settings, host="127.0.0.1", port=8000)).run()  # connections.py

FastAPI and uvicorn are imported only by the modules that use them, and those only when one of these
names is first used, so that `atlas serve --help` (which reads `atlas.serve.serve_settings`) answers at once.
"""

from __future__ import annotations

from importlib import import_module

_WHERE = {
    "AtlasService": "atlas.serve.service",
    "create_app": "atlas.serve.app",
    "ServeSettings": "atlas.serve.serve_settings",
    "uvicorn_config": "atlas.serve.connections",
}
__all__ = ["AtlasService", "ServeSettings", "create_app", "uvicorn_config"]


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(_WHERE[name]), name)
