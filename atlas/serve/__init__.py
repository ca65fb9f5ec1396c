"""`atlas serve`: a long-lived HTTP server over a loaded run (API, web page, live corpus edits).

    service = AtlasService(atlas.Atlas.from_pretrained(RUN, index=INDEX))  # answer / search / edit
    app = create_app(service, allow_edits=True)  # atlas.serve.app: FastAPI, run by uvicorn

FastAPI and uvicorn are imported only here, so the rest of atlas does not need them.
"""

from atlas.serve.app import create_app
from atlas.serve.service import AtlasService

__all__ = ["AtlasService", "create_app"]
