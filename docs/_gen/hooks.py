"""MkDocs hooks (mkdocs.yml `hooks:`): the pages and figures made from the code and the measurements.

At every build, before the pages are read:
- `reference/cli.md`, `reference/config.md`, `reference/http.md` and `reference/openapi.json` are generated from
  the argparse parser, the config dataclasses and the server's OpenAPI schema (`reference.py`);
- every figure of `figures.py` is drawn with matplotlib from the measurements in `results/data/*.json` as
  `results/img/NAME.svg`.
Each replaces the copy git keeps under docs/ (for readers of the repository), so the site is always made from
the code as it is; nothing is written to docs/ (`python docs/_gen/reference.py --write` renews the copies).
"""

from __future__ import annotations

import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

sys.path.insert(0, str(Path(__file__).parent))

import figures
import reference


def on_files(files: Files, config) -> Files:
    generated = {
        **reference.generated_pages(),
        **{f"results/img/{name}.svg": svg for name, svg in figures.draw_all().items()},
    }
    for uri, content in generated.items():
        kept = files.get_file_from_path(uri)
        if kept is not None:
            files.remove(kept)
        files.append(File.generated(config, uri, content=content))
    return files
