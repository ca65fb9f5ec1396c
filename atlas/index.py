"""`atlas.Index`: a passage index folder as one object a user holds: build it from documents, open it,
search it, edit it in place. Every `atlas.Atlas` model given the same `Index` reads its latest commit: an
edit is seen by the next `answer`.

    index = atlas.Index.build("docs.jsonl", "runs/idx")   # prepared corpus at runs/idx-corpus
    index = atlas.Index.load("runs/idx")
    index.add([{"id": "p1", "title": "Biole", "text": "Biole's capital is Varn."}])
    index.update([{"id": "p1", "text": "Biole's capital is Ostra."}])
    index.remove(["p1"])
    index.search("capital of Biole", k=5)                 # → [Passage(id, title, text, score, …), …]

Edits are committed on disk first (new files, then the manifest replaced atomically; the writer lock refuses
a second writer), then the index is reopened: the files, not this object, are the truth.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from atlas.quiet import quiet_libraries
from tasks.io import write_jsonl
from tasks.limits import MAX_PASSAGE_CHARS, MAX_SEARCH_K, check_k
from tasks.passage import Passage

DEFAULT_ENCODER = "minilm"


def compute_device(context=None):
    """Where a model runs: the rank's device under torchrun (`context`, an `atlas.distributed.DistributedContext`),
    else the first GPU if there is one, else the CPU."""
    import torch  # heavy: only once a model is loaded

    if context is not None:
        return context.device
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def index_retriever(
    folder: str | os.PathLike | None = None, encoder: str | None = None, *, device=None, verbose: bool = False
):
    """The retriever that searches the index at `folder`: `encoder` (a name such as "minilm", a folder or a
    hub id; default: the one the index records, else MiniLM), formatting and cutting passages as the index's
    manifest records (`passage_format`, `passage_maxlength`), so that its fingerprint is the index's; in eval
    mode on `device` (default `compute_device()`). The libraries' load reports show only when `verbose`."""
    from retriever.encoder import Retriever  # heavy: torch, transformers
    from retriever.index_files import read_manifest  # heavy: faiss
    from tasks.modeling import encoder_source

    record = read_manifest(folder).get("encoder", {}) if folder is not None else {}
    encoder = encoder or record.get("source") or DEFAULT_ENCODER
    settings = {key: record[key] for key in ("passage_format", "passage_maxlength") if record.get(key) is not None}
    with quiet_libraries(verbose):
        retriever = Retriever.from_pretrained(encoder_source(encoder), **settings)
    return retriever.to(device if device is not None else compute_device()).eval()


def _records(passages: Iterable[Mapping | Passage], what: str) -> list[dict]:
    """Passages as the JSONL records the index's edits read: {"id", "title", "text"}; ValueError naming the
    first one without an id or a text."""
    records = []
    for n, passage in enumerate(passages):
        record = dict(passage.fields()) | {"id": passage.id} if isinstance(passage, Passage) else dict(passage)
        if not record.get("id"):
            raise ValueError(f"{what}: passage {n} has no 'id'")
        if "text" not in record:
            raise ValueError(f"{what}: passage {record['id']!r} has no 'text'")
        if len(str(record["text"])) > MAX_PASSAGE_CHARS and what != "Index.add(chunked)":
            raise ValueError(
                f"{what}: passage {record['id']!r} has {len(record['text']):,} characters; the limit is "
                f"{MAX_PASSAGE_CHARS:,} for one passage (its start alone would be embedded): split it, e.g. "
                "Index.add(..., chunk_words=100)"
            )
        records.append({k: v for k, v in record.items() if v is not None})
    if not records:
        raise ValueError(f"{what}: no passages given")
    return records


class Index:
    """An opened passage index (`retriever.index.PassageIndex`) with the retriever that embeds its queries and
    new passages. Build one with `Index.build`, open one with `Index.load`."""

    def __init__(self, passage_index, retriever, *, allow_encoder_mismatch: bool = False):
        self._current = passage_index
        self.retriever = retriever
        self.allow_encoder_mismatch = allow_encoder_mismatch

    # ------------------------------------------------------------------ opening
    @classmethod
    def build(
        cls,
        source: str | os.PathLike | Sequence[str | os.PathLike],
        out: str | os.PathLike,
        *,
        encoder: str = DEFAULT_ENCODER,
        spec: str = "Flat",
        chunk_words: int = 100,
        passage_maxlength: int | None = None,
        corpus_out: str | os.PathLike | None = None,
        overwrite: bool = False,
        progress: bool = True,
        **options,
    ) -> Index:
        """Index documents: `source` is a prepared corpus folder (`atlas corpus prepare`) or documents (JSONL
        `{"id", "title", "text"}` or DPR TSV files), split into passages of `chunk_words` words and prepared
        at `corpus_out` (default: OUT-corpus beside the index). Embedded with `encoder` (passages cut at
        `passage_maxlength` tokens; default: the encoder's own), written to `out` as an index of `spec`
        ("Flat", "IVF1024,PQ64", …; `options`: `retriever.index_build.build_index`'s, e.g. `exact_rerank`).
        Resumable: a killed build continues from its last embedded chunk when run again."""
        from retriever.corpus import prepare_corpus  # heavy: pyarrow
        from retriever.index_build import build_index  # heavy: faiss

        out = Path(out)
        if out.exists() and not overwrite:
            raise FileExistsError(
                f"{out} already exists: Index.load({str(out)!r}) opens it, overwrite=True replaces it"
            )
        sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
        if len(sources) == 1 and (Path(sources[0]) / "corpus.json").is_file():
            corpus = Path(sources[0])
        else:
            corpus = Path(corpus_out) if corpus_out is not None else out.parent / f"{out.name}-corpus"
            if corpus.exists() and not overwrite:
                raise FileExistsError(
                    f"{corpus} already exists (a corpus prepared before): build from it, Index.build({str(corpus)!r}, "
                    f"{str(out)!r}), or pass overwrite=True to prepare it again"
                )
            prepare_corpus(sources, corpus, chunk_words=chunk_words, overwrite=overwrite, progress=progress)
        retriever = index_retriever(None, encoder)
        if passage_maxlength is not None:
            retriever.passage_maxlength = passage_maxlength
        build_index(
            corpus, retriever, out, spec=spec, overwrite=overwrite, progress=progress, encoder_source=encoder, **options
        )
        return cls.load(out)

    @classmethod
    def load(
        cls,
        path: str | os.PathLike,
        *,
        encoder: str | None = None,
        allow_encoder_mismatch: bool = False,
        nprobe: int | None = None,
        ef_search: int | None = None,
        exact_rerank: int | None = None,
        device=None,
    ) -> Index:
        """Open the index folder `path`, searched with `encoder` (default: the one it records); the search
        settings default to the index's own. Refused (`ValueError`) when `encoder` is not the one that built
        it, unless `allow_encoder_mismatch`."""
        from retriever.index import PassageIndex  # heavy: faiss

        retriever = index_retriever(path, encoder, device=device)
        index = PassageIndex.load(
            path,
            retriever=retriever,
            allow_encoder_mismatch=allow_encoder_mismatch,
            nprobe=nprobe,
            ef_search=ef_search,
            exact_rerank=exact_rerank,
        )
        return cls(index, retriever, allow_encoder_mismatch=allow_encoder_mismatch)

    def reload(self) -> None:
        """Reopen the folder's last commit (after an edit made elsewhere, e.g. by `atlas index add`); models
        holding this index read it from their next answer on."""
        from retriever.index import PassageIndex  # heavy: faiss

        current = self._current
        self._current = PassageIndex.load(
            current.folder,
            retriever=self.retriever,
            allow_encoder_mismatch=self.allow_encoder_mismatch,
            nprobe=current.nprobe,
            ef_search=current.ef_search,
            exact_rerank=current.exact_rerank,
        )

    # ------------------------------------------------------------------ reading
    @property
    def current(self):
        """The `retriever.index.PassageIndex` of the last commit (what a model searches)."""
        return self._current

    @property
    def path(self) -> Path:
        """The index folder."""
        return Path(self._current.folder)

    @property
    def manifest(self) -> dict:
        """The last commit's manifest (`manifest.json`: spec, counts, encoder, files, segments)."""
        return self._current.manifest

    def __len__(self) -> int:
        """Live passages."""
        return len(self._current)

    def __repr__(self) -> str:
        return f"Index({str(self.path)!r}, passages={len(self)}, spec={self.manifest['spec']!r})"

    def search(self, query: str | Sequence[str], k: int = 10) -> list[Passage] | list[list[Passage]]:
        """The top-k passages (`Passage`: id, title, text, score, row), best first, for one query; for a list
        of queries, one such list per query."""
        check_k(k, MAX_SEARCH_K)
        single = isinstance(query, str)
        hits = self._current.search([query] if single else list(query), k)
        return hits[0] if single else hits

    def get(self, passage_id: str) -> Passage:
        """The live passage `passage_id`; KeyError naming it where there is none."""
        return Passage.from_record(self._current.get([passage_id])[0])

    # ------------------------------------------------------------------ editing
    def add(self, passages: Iterable[Mapping | Passage], *, chunk_words: int = 0, progress: bool = False):
        """Embed and add passages (dicts {"id", "title", "text"} or `Passage`s) under new ids (an id that is
        live is refused: `update` it); with `chunk_words`, each is split into passages ID-0, ID-1, … → the
        edit's `UpdateStats`."""
        from retriever.index_update import add_passages  # heavy: faiss

        what = "Index.add(chunked)" if chunk_words > 0 else "Index.add"
        return self._edit(add_passages, _records(passages, what), chunk_words=chunk_words, progress=progress)

    def update(self, passages: Iterable[Mapping | Passage], *, progress: bool = False):
        """Replace live passages by id (a record without a title keeps the passage's) → `UpdateStats`."""
        from retriever.index_update import update_passages  # heavy: faiss

        return self._edit(update_passages, _records(passages, "Index.update"), progress=progress)

    def remove(self, ids: Iterable[str]):
        """Remove passages by id → `UpdateStats` (`removed`; an id removed already is counted in
        `already_removed`); KeyError naming an id the index never held (nothing changes then)."""
        from retriever.index_update import remove_passages  # heavy: faiss

        ids = [str(i) for i in ids]
        if not ids:
            raise ValueError("Index.remove: no ids given")
        stats = remove_passages(self.path, ids)
        self.reload()
        return stats

    def compact(self):
        """Rewrite the index without its removed rows and merge its segments → `CompactionStats`."""
        from retriever.index_compact import compact_index  # heavy: faiss

        stats = compact_index(self.path)
        self.reload()
        return stats

    def _edit(self, edit, records: list[dict], **options):
        with tempfile.TemporaryDirectory(prefix="atlas-index-edit-") as tmp:
            path = Path(tmp) / "passages.jsonl"
            write_jsonl(path, records)
            try:
                stats = edit(
                    self.path, [path], self.retriever, allow_encoder_mismatch=self.allow_encoder_mismatch, **options
                )
            except (ValueError, KeyError) as e:  # name the passage as the caller gave it, not the file it went by
                message = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
                message = re.sub(rf"{re.escape(str(path))}:(\d+)", lambda m: f"passage {int(m[1]) - 1}", message)
                raise type(e)(message.replace(str(path), "the passages given")) from None
        self.reload()
        return stats
