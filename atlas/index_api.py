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
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import torch
from huggingface_hub import try_to_load_from_cache

from atlas.quiet import quiet_libraries
from common.limits import MAX_SEARCH_K, check_k
from common.modeling import DEFAULT_ENCODER, MINILM, encoder_source, is_hub_id
from retriever.corpus import Corpus, prepare_corpus, write_corpus
from retriever.corpus_manifest import CORPUS_MANIFEST
from retriever.index import PassageIndex
from retriever.index.build import build_index
from retriever.index.compact import compact_index
from retriever.index.manifest import EncoderSettings, Manifest
from retriever.index.settings import IndexSettings
from retriever.index.update import add_passages, passage_documents, read_passage_files, remove_passages, update_passages
from retriever.retriever import Retriever
from tasks.passage import Passage


def compute_device(context=None):
    """Where a model runs: the rank's device under torchrun (`context`, an `atlas.distributed.DistributedContext`),
    else the first GPU if there is one, else the CPU."""

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

    record = Manifest.load(folder).encoder if folder is not None else EncoderSettings()
    encoder = encoder or record.source or DEFAULT_ENCODER
    check_encoder_name(encoder)
    settings = record.passage_settings()
    with quiet_libraries(verbose):
        retriever = Retriever.from_pretrained(encoder_source(encoder), **settings)
    return retriever.to(checked_device(device) if device is not None else compute_device()).eval()


def checked_device(device) -> torch.device:
    """`device` as a `torch.device` that this machine has; ValueError in one line for a name torch does not know or
    a device that is not here (`device="cuda"` without a GPU)."""
    try:
        resolved = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(
            f"device={device!r}: not a device name torch knows ('cpu', 'cuda', 'cuda:1', ...): {e}"
        ) from None
    if resolved.type == "cuda" and (
        not torch.cuda.is_available() or (resolved.index or 0) >= torch.cuda.device_count()
    ):
        have = f"{torch.cuda.device_count()} CUDA device(s)" if torch.cuda.is_available() else "no CUDA device"
        raise ValueError(f"device={device!r}: this machine has {have}; use device='cpu' or leave it unset")
    return resolved


def check_encoder_name(encoder: str) -> None:
    """Refuse at once, in one line, an encoder that `index_retriever` cannot load without asking the network: a
    name atlas knows ("minilm", "contriever"), a folder here, or a Hugging Face Hub id (owner/name) in the local
    cache. A Hub id that is not cached is downloaded only when the user asked (`HF_HUB_OFFLINE=0`); anything else
    would be tried on the Hub, with its retries and its library's log lines, before failing."""
    source = encoder_source(encoder)
    if Path(source).exists():
        return
    if not is_hub_id(source):
        raise FileNotFoundError(
            f"encoder {encoder!r}: not a name atlas knows ({MINILM}, contriever), no such folder "
            f"({Path(encoder).resolve()}), and not a Hugging Face Hub id (owner/name)"
        )
    cached = try_to_load_from_cache(source, "config.json", cache_dir=os.environ.get("HF_HUB_CACHE") or None)
    if isinstance(cached, str) or os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("0", "false", "no", "off"):
        return
    raise FileNotFoundError(
        f"encoder {encoder!r}: not a folder here and not in the Hugging Face cache; nothing is downloaded unless you "
        f"ask: fetch it once (`hf download {source}`), or set HF_HUB_OFFLINE=0 to let atlas download it"
    )


def _manifest_stamp(folder: Path) -> tuple[int, int, int]:
    """What changes when a commit replaces the manifest (written aside, then renamed over it): its inode, its
    modification time and its size."""
    stat = os.stat(Path(folder) / "manifest.json")
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


def _strings(values: object, where: str, what: str) -> list[str]:
    """`values`, a list or other iterable of strings (not one string, not bytes), as a list; TypeError in one line
    naming `where` and the first value that is not a string."""
    if isinstance(values, (bytes, bytearray, Mapping)) or not isinstance(values, Iterable):
        raise TypeError(f"{where} takes {what}, not {type(values).__name__}: {values!r:.80}")
    values = list(values)
    wrong = next((v for v in values if not isinstance(v, str)), None)
    if wrong is not None:
        raise TypeError(f"{where} takes {what}; {wrong!r:.80} is {type(wrong).__name__}, not str")
    return values


class Index:
    """An opened passage index (`retriever.index.PassageIndex`) with the retriever that embeds its queries and
    new passages. Build one with `Index.build`, open one with `Index.load`."""

    def __init__(self, passage_index, retriever, *, allow_encoder_mismatch: bool = False):
        self._current = passage_index
        self.retriever = retriever
        self.allow_encoder_mismatch = allow_encoder_mismatch
        self._stamp = _manifest_stamp(passage_index.folder)

    # ------------------------------------------------------------------ opening
    @classmethod
    def build(
        cls,
        source: str | os.PathLike | Sequence[str | os.PathLike] | Sequence[Mapping | Passage],
        out: str | os.PathLike,
        *,
        encoder: str = DEFAULT_ENCODER,
        spec: str = "Flat",
        chunk_words: int = 100,
        passage_maxlength: int | None = None,
        corpus_out: str | os.PathLike | None = None,
        overwrite: bool = False,
        progress: bool = True,
        precision: str | None = None,
        device=None,
        **options,
    ) -> Index:
        """Index documents: `source` is a prepared corpus folder (`atlas corpus prepare`), documents in files
        (JSONL `{"id", "title", "text"}` or DPR TSV), or documents in memory (dicts of those fields, or
        `Passage`s), split into passages of `chunk_words` words and prepared at `corpus_out` (default: OUT-corpus
        beside the index). Embedded with `encoder` on `device` (default `compute_device()`; passages cut at
        `passage_maxlength` tokens; default: the encoder's own), written to `out` as an index of `spec`
        ("Flat", "IVF1024,PQ64", …; `options`: the other fields of `retriever.index.settings.IndexSettings`, e.g.
        `exact_rerank`).
        `precision`: what passages are embedded at, "auto" (bfloat16 where the CPU multiplies it natively),
        "fp32", "bf16" or None (the encoder's own setting, auto unless set); recorded in the index. Resumable: a
        killed build continues from its last embedded chunk when run again."""
        # heavy: pyarrow, faiss

        out, settings = Path(out), IndexSettings(spec=spec, **options)  # a misspelt option fails first
        if out.exists() and not overwrite:
            raise FileExistsError(
                f"{out} already exists: Index.load({str(out)!r}) opens it, overwrite=True replaces it"
            )
        sources = [source] if isinstance(source, (str, os.PathLike)) else list(source)
        in_memory = not all(isinstance(s, (str, os.PathLike)) for s in sources)
        documents = passage_documents(sources) if in_memory else None  # checked before anything is loaded
        retriever = index_retriever(None, encoder, device=device)  # a wrong encoder fails before a corpus is written
        if not in_memory and len(sources) == 1 and (Path(sources[0]) / CORPUS_MANIFEST).is_file():
            corpus = Path(sources[0])
        else:
            corpus = Path(corpus_out) if corpus_out is not None else out.parent / f"{out.name}-corpus"
            if corpus.exists() and not overwrite:
                raise FileExistsError(
                    f"{corpus} already exists (a corpus prepared before): build from it, Index.build({str(corpus)!r}, "
                    f"{str(out)!r}), or pass overwrite=True to prepare it again"
                )
            if in_memory:
                given = ["(passages given in memory)"]
                write_corpus(documents, corpus, chunk_words=chunk_words, sources=given, overwrite=overwrite)
            else:
                prepare_corpus(sources, corpus, chunk_words=chunk_words, overwrite=overwrite, progress=progress)
        if passage_maxlength is not None:
            retriever.passage_maxlength = passage_maxlength
        build_index(
            corpus,
            retriever,
            out,
            settings,
            overwrite=overwrite,
            progress=progress,
            encoder_source=encoder,
            precision=precision,
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

        current = self._current
        stamp = _manifest_stamp(current.folder)  # before the load: a commit landing meanwhile is seen next time
        self._current = PassageIndex.load(
            current.folder,
            retriever=self.retriever,
            allow_encoder_mismatch=self.allow_encoder_mismatch,
            nprobe=current.nprobe,
            ef_search=current.ef_search,
            exact_rerank=current.exact_rerank,
        )
        self._stamp = stamp

    def reload_if_changed(self) -> tuple[int, int] | None:
        """Reopen the folder when its manifest was replaced since this index read it (a commit made by another
        process: `atlas index add`, `atlas index compact`, another server) → (generation held, generation now);
        None when nothing changed. Costs one `stat` when nothing did."""
        if _manifest_stamp(self._current.folder) == self._stamp:
            return None
        before = self._current.manifest.generation
        self.reload()
        return before, self._current.manifest.generation

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
    def manifest(self):
        """The last commit's `retriever.index.manifest.Manifest` (spec, counts, encoder, embedding precision,
        files, segments)."""
        return self._current.manifest

    def __len__(self) -> int:
        """Live passages."""
        return len(self._current)

    def __repr__(self) -> str:
        return f"Index({str(self.path)!r}, passages={len(self)}, spec={self.manifest.spec!r})"

    def search(self, query: str | Sequence[str], k: int = 10) -> list[Passage] | list[list[Passage]]:
        """The top-k passages (`Passage`: id, title, text, score, row), best first, for one query; for a list
        of queries, one such list per query."""
        check_k(k, MAX_SEARCH_K)
        single = isinstance(query, str)
        queries = [query] if single else _strings(query, "Index.search", "a query (str) or a list of queries")
        for n, q in enumerate(queries):
            if not q.strip():
                raise ValueError(f"Index.search: {'the query' if single else f'query {n}'} is empty")
        hits = self._current.search(queries, k)
        return hits[0] if single else hits

    def get(self, passage_id: str) -> Passage:
        """The live passage `passage_id`; KeyError naming it where there is none."""
        if not isinstance(passage_id, str):
            raise TypeError(f"Index.get takes a passage id (str), not {type(passage_id).__name__}: {passage_id!r:.80}")
        return Passage.from_record(self._current.get([passage_id])[0])

    # ------------------------------------------------------------------ editing
    def add(
        self,
        passages: Iterable[Mapping | Passage] | str | os.PathLike,
        *,
        chunk_words: int = 0,
        progress: bool = False,
        precision: str | None = None,
    ):
        """Embed and add passages (dicts {"id", "title", "text"} or `Passage`s; or the path of a JSONL / TSV file
        of them) under new ids (an id that is live is refused: `update` it); with `chunk_words`, each is split
        into passages ID-0, ID-1, …; `precision`: what they are embedded at ("auto", "fp32", "bf16") → the
        edit's `UpdateStats`. Errors name a passage as given: "passage 3 (id 'x')", or "FILE:LINE"."""

        return self._edit(add_passages, passages, chunk_words=chunk_words, progress=progress, precision=precision)

    def update(
        self,
        passages: Iterable[Mapping | Passage] | str | os.PathLike,
        *,
        progress: bool = False,
        precision: str | None = None,
    ):
        """Replace live passages by id (a record without a title keeps the passage's; a path: a JSONL / TSV file of
        them) → `UpdateStats`."""

        return self._edit(update_passages, passages, progress=progress, precision=precision)

    def remove(self, ids: str | Iterable[str]):
        """Remove passages by id → `UpdateStats` (`removed`; an id removed already is counted in
        `already_removed`); KeyError naming an id the index never held (nothing changes then)."""

        ids = [ids] if isinstance(ids, str) else _strings(ids, "Index.remove", "a passage id (str) or a list of them")
        if not ids:
            raise ValueError("Index.remove: no ids given")
        stats = remove_passages(self.path, ids)
        self.reload()
        return stats

    def compact(self):
        """Rewrite the index without its removed rows and merge its segments → `CompactionStats`."""

        stats = compact_index(self.path)
        self.reload()
        return stats

    def _edit(self, edit, passages, **options):
        """Run `edit` (`add_passages`, `update_passages`) on the passages given, then reopen the index."""
        if isinstance(passages, (str, os.PathLike)) and (Path(passages) / CORPUS_MANIFEST).is_file():
            records = Corpus.load(passages)  # a prepared corpus, added as it is
        elif isinstance(passages, (str, os.PathLike)):  # a file: read here, at the edge; errors name its lines
            records, origins = read_passage_files([passages])
            options |= {"origins": origins, "sources": [str(Path(passages).resolve())]}
        else:
            records = list(passages)
        stats = edit(self.path, records, self.retriever, allow_encoder_mismatch=self.allow_encoder_mismatch, **options)
        self.reload()
        return stats
