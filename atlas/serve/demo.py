"""A servable run with no training: the shipped `atlas-reader` over the demo encyclopedia.

For trying `atlas serve` at once, for the tests and for `bench/serve.py`. A trained run (e.g.
`atlas quickstart`'s OUT/train) is served the same way.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from atlas.config import save_config
from atlas.demo.quickstart import demo_data, quickstart_config
from atlas.loading import SHIPPED_READER
from retriever.corpus import prepare_corpus
from retriever.index.build import build_index
from retriever.retriever import Retriever


def build_demo_run(out: str | Path, *, progress: bool = False) -> Path:
    """Prepare the demo corpus, build its MiniLM `Flat` index and write a run folder; → OUT/run.

    OUT/corpus, OUT/index, and OUT/run (config.yaml: the quickstart recipe pointed at OUT/index;
    reader/: the shipped reader, linked where the file system allows, else copied). Idempotent:
    an OUT that already holds a run is returned as it is.
    """
    # heavy: pyarrow and faiss (corpus and index build), only when the demo run is built

    out = Path(out)
    run = out / "run"
    if (run / "config.yaml").is_file():
        return run
    data = demo_data()
    config = quickstart_config(out, data)
    if not (out / "corpus").is_dir():
        prepare_corpus([str(p) for p in data.documents], out / "corpus", chunk_words=0, progress=progress)
    if not (out / "index").is_dir():
        build_index(out / "corpus", Retriever.from_config(config.retriever), out / "index", progress=progress)
    run.mkdir(parents=True, exist_ok=True)
    if not (run / "reader").exists():
        try:
            os.symlink(SHIPPED_READER, run / "reader", target_is_directory=True)
        except OSError:  # no symlinks here (some Windows set-ups)
            shutil.copytree(SHIPPED_READER, run / "reader")
    save_config(config, run / "config.yaml")  # last: its presence marks a finished run
    return run
