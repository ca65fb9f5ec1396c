"""What `atlas serve` does with a loaded run: answer, search, edit the corpus, describe itself.

Threads (why): every use of the model (retrieval, reading) runs on one thread, `model_executor`,
so that batches never compete for the CPU/GPU and the model needs no locks. Corpus edits run
on a second thread, `edit_executor` (one at a time: edits are serialised), with a copy of the
retriever, so that embedding new passages and writing the index does not stall questions.
An edit is committed on disk first (`retriever.index.update`: new files, then an atomic
manifest replace), then the reloaded index is swapped in on the model thread between two
batches: a question is answered wholly from the index before an edit or wholly after it.

Compaction (`retriever.index.compact`): after an edit that leaves the index due for one, a
compaction is queued on the edit thread behind it (the edit's response does not wait for it),
committed the same way and swapped in between two batches as an edit is; edits that arrive
meanwhile queue behind it. It changes no passage and no search result, only the files.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from retriever.index.compact import compact_if_due, compaction_due
from retriever.index.files import IndexLockedError
from retriever.index.update import add_passages, remove_passages
from tasks.base import Example

logger = logging.getLogger(__name__)


class PassageNotFound(KeyError):
    """A passage id that is not live in the index (HTTP 404)."""


class PassageExists(ValueError):
    """An added passage id that is already live in the index (HTTP 409)."""


class EditsRefused(ValueError):
    """An edit request that is malformed as a whole: an empty one (HTTP 422)."""


class EditsConflict(ValueError):
    """An edit that names one passage twice (across add, update and remove): HTTP 409."""


class IndexBusy(RuntimeError):
    """Another process holds the index's writer lock (HTTP 503: try again)."""


@dataclass(frozen=True)
class Question:
    """One question of a micro-batch: the text and the number of passages to read."""

    question: str
    k: int


class AtlasService:
    """A loaded model (`atlas.Atlas` with its `Index`) and the operations the API offers.

    Args:
        atlas: the model, with a retriever and an `Index` (not sharded): questions are answered by its
            `answer_examples`, the one answer path of every front end.
        auto_compact: compact the index after an edit that leaves it due for one
            (`retriever.index.compact.compaction_due`); off: only `atlas index compact` does.
    """

    def __init__(self, atlas, *, auto_compact: bool = True):
        if atlas.model.retriever is None or atlas.index is None:
            raise ValueError(
                "atlas serve needs a run with a retriever and a (not sharded) passage index; give one with --index DIR"
            )
        self.atlas = atlas
        self.model = atlas.model.eval()
        self.config = atlas.config
        self.checkpoint = (
            Path(atlas.source.path) if atlas.source is not None and atlas.source.kind == "checkpoint" else None
        )
        self.task = atlas.task
        self.model_executor = ThreadPoolExecutor(1, thread_name_prefix="atlas-model")
        self.edit_executor = ThreadPoolExecutor(1, thread_name_prefix="atlas-edit")
        self.auto_compact = auto_compact
        self.compactions = 0  # compactions swapped in since the start
        self._editing = False  # an edit or compaction of this server is committing (edit thread)
        self.started = time.monotonic()
        # (index generation, the encoder's fingerprint): hashing the encoder reads every weight, so it is done once
        # per generation the server serves (a new one is where what it serves changes), on the model thread
        self._fingerprint: tuple[int, str] | None = None

    # ------------------------------------------------------------------ state
    @property
    def index(self):
        """The committed index being served (replaced as a whole by each edit)."""
        return self.atlas.index.current

    @property
    def default_k(self) -> int:
        """Passages read per question when a request does not say: the model's `n_read`."""
        return self.model.n_read

    def close(self) -> None:
        """Let running work finish, then stop both threads."""
        self.edit_executor.shutdown(wait=True)
        self.model_executor.shutdown(wait=True)

    # ------------------------------------------------------------------ questions (model thread)
    def answer(self, questions: Sequence[Question]) -> list[dict]:
        """Answer a micro-batch: one retrieval and one reader pass per distinct k (`Atlas.answer_examples`).

        → per question {"question", "answer", "k", "evidence": [{id, title, text, score,
        attention}], "attended", "citations": [{passage_id, field, start, end, quote}], "supported",
        "generation"}; `attention` is the passage's share of the reader's cross-attention mass while it
        produced the answer (`reader.attention_scores`); `citations` are `Answer.citations`, best first.
        """
        self._pick_up_commits_made_elsewhere()
        results: list[dict | None] = [None] * len(questions)
        by_k: dict[int, list[int]] = {}
        for n, q in enumerate(questions):
            by_k.setdefault(q.k, []).append(n)
        for k, positions in by_k.items():
            examples = [
                Example(id=str(n), query=self.task.query(questions[n].question), target=None, answers=[])
                for n in positions
            ]
            answers = self.atlas.answer_examples(
                examples, k=k, with_attention=True, questions=[questions[n].question for n in positions]
            )
            for n, answer in zip(positions, answers):
                evidence = [
                    {"id": p.id, "title": p.title, "text": p.text, "score": float(p.score or 0.0), "attention": a}
                    for p, a in zip(answer.passages, answer.attention or [])
                ]
                attended = max(evidence, key=lambda e: e["attention"])["id"] if evidence else None
                results[n] = {
                    "question": answer.question,
                    "answer": answer.text,
                    "k": k,
                    "evidence": evidence,
                    "attended": attended,
                    "citations": [c.record() for c in answer.citations],
                    "supported": answer.supported,
                    "generation": answer.generation,
                }
        return results

    @torch.no_grad()
    def search(self, query: str, k: int) -> dict:
        """Retrieval only: → {"query", "hits": [{id, title, text, score}], "generation"} (model thread)."""
        self._pick_up_commits_made_elsewhere()
        index = self.index
        vectors = self.model.retriever.embed_queries([self.task.query(query)])
        hits = index.search(vectors, k)[0]
        return {
            "query": query,
            "generation": index.manifest.generation,
            "hits": [{"id": h.id, "title": h.title, "text": h.text, "score": h.score} for h in hits],
        }

    def passage(self, passage_id: str) -> dict:
        """The live passage with this id: {id, title, text}; `PassageNotFound` if there is none."""
        index = self.index
        position = index.position_of(passage_id)
        if position is None:
            raise PassageNotFound(f"no passage with id {passage_id!r} in the index")
        record = index.passages([position])[0]
        return {"id": record["id"], "title": record.get("title") or "", "text": record["text"]}

    # ------------------------------------------------------------------ edits (edit thread)
    def edit(self, *, add: Sequence[dict] = (), update: Sequence[dict] = (), remove: Sequence[str] = ()) -> dict:
        """Apply adds, updates and removals to the index as ONE commit, then serve the result.

        add: [{id, title, text}] with new ids; update: [{id, title (None: keep), text}] of live
        passages (the old version is removed in the same commit); remove: live ids. Raises
        `PassageExists` / `PassageNotFound` / `EditsRefused` / `EditsConflict` before anything is
        written, and `IndexBusy` when another process holds the index's writer lock.
        → {"added", "updated", "removed", "count", "generation"}. Call on `edit_executor`.
        """
        index = self.index  # the last commit: edits run one at a time on this thread
        ids = [p["id"] for p in add] + [p["id"] for p in update] + list(remove)
        if not ids:
            raise EditsRefused("the edit is empty: give passages to add or update, or ids to remove")
        repeated = sorted({i for i in ids if ids.count(i) > 1})
        if repeated:
            raise EditsConflict(f"each passage may appear once per edit; repeated: {', '.join(map(repr, repeated))}")
        existing = [p["id"] for p in add if index.position_of(p["id"]) is not None]
        if existing:
            raise PassageExists(
                f"passage id(s) already in the index: {', '.join(map(repr, existing))} (update them instead)"
            )
        unknown = [i for i in [p["id"] for p in update] + list(remove) if index.position_of(i) is None]
        if unknown:
            raise PassageNotFound(f"no passage with id(s) {', '.join(map(repr, unknown))} in the index")
        new = [{"id": p["id"], "title": p.get("title") or "", "text": p["text"]} for p in add]
        for p in update:
            title = p.get("title")
            new.append(
                {"id": p["id"], "title": self.passage(p["id"])["title"] if title is None else title, "text": p["text"]}
            )
        replaced = [p["id"] for p in update] + list(remove)
        retriever = self.atlas.index.retriever  # the index's own: the model thread embeds with the model's
        allow_mismatch = self.atlas.index.allow_encoder_mismatch
        self._editing = True  # this commit is ours: the model thread leaves its reload to this thread
        try:
            if new:  # the passages in memory: no file holds their text on the way
                add_passages(
                    index.folder,
                    new,
                    retriever,
                    chunk_words=0,
                    progress=False,
                    remove=replaced,
                    allow_encoder_mismatch=allow_mismatch,
                    sources=["atlas serve edit"],
                )
            else:
                remove_passages(index.folder, replaced)
        except IndexLockedError as e:
            raise IndexBusy(str(e)) from None
        finally:
            fresh = self._swap_in_index_from_disk()
            self._editing = False
        if self.auto_compact and compaction_due(fresh.manifest) is not None:
            self.edit_executor.submit(self._compact)  # runs after this edit, before the next one
        return {
            "added": [p["id"] for p in add],
            "updated": [p["id"] for p in update],
            "removed": list(remove),
            "count": len(fresh),
            "generation": fresh.manifest.generation,
        }

    def _pick_up_commits_made_elsewhere(self) -> None:
        """Before a batch (model thread): read a commit another process made to the index folder (`atlas index
        add|update|remove|compact` from a shell), and say so; the server's own edits reload on the edit thread."""
        if self._editing:
            return
        changed = self.atlas.index.reload_if_changed()
        if changed is not None:
            logger.info(
                "index %s: generation %d -> %d, committed by another process; serving it from this batch on",
                self.index.folder,
                *changed,
            )

    def _swap_in_index_from_disk(self):
        """Reopen the index's last commit; the model reads it from its next batch on (edit thread)."""
        self.atlas.index.reload()
        return self.index

    def _compact(self) -> None:
        """Compact the index when it is (still) due, and serve the result (edit thread; queued by
        `edit`). A failure is logged and leaves the index as it was: the next edit tries again."""
        self._editing = True  # as in `edit`: this commit is ours
        try:
            stats = compact_if_due(self.index.folder)
        except (IndexLockedError, OSError, ValueError) as e:
            logger.warning("compaction of %s skipped: %s", self.index.folder, e)
            return
        finally:
            self._swap_in_index_from_disk()
            self._editing = False
        if stats is None or not stats.compacted:
            return
        self.compactions += 1
        logger.info(
            "compacted %s: %d -> %d segments, %d -> %d rows in %.2f s",
            self.index.folder,
            stats.segments_before,
            stats.segments_after,
            stats.rows_before,
            stats.rows_after,
            stats.seconds,
        )

    # ------------------------------------------------------------------ description
    def health(self) -> dict:
        """Liveness and the state served: live passages, index generation, uptime."""
        index = self.index
        manifest = index.manifest
        return {
            "status": "ok",
            "passages": len(index),
            "generation": manifest.generation,
            "dead_rows": manifest.dead_rows,
            "segments": len(manifest.segments),
            "compactions": self.compactions,
            "uptime_s": round(time.monotonic() - self.started, 3),
        }

    def describe(self) -> dict:
        """The loaded run: checkpoint, task, reader, retriever (encoder fingerprint) and index. Hashes the encoder
        when the fingerprint of the index generation being served is not known yet: call on `model_executor`, or
        call `known_description` first."""
        index = self.index
        generation = index.manifest.generation
        if self._fingerprint is None or self._fingerprint[0] != generation:
            self._fingerprint = (generation, self.model.retriever.passage_fingerprint())
        return self._description(index, self._fingerprint[1])

    def known_description(self) -> dict | None:
        """`describe()` when it would not touch the encoder (its fingerprint for the index generation being served
        is known), from any thread; else None."""
        index, known = self.index, self._fingerprint
        if known is None or known[0] != index.manifest.generation:
            return None
        return self._description(index, known[1])

    def _description(self, index, passage_fingerprint: str) -> dict:
        model, config = self.model, self.config
        manifest = index.manifest
        return {
            "checkpoint": str(self.checkpoint) if self.checkpoint else None,
            "task": config.task.name,
            "reader": {
                "model": config.reader.model,
                "class": type(model.reader.seq2seq).__name__,
                "parameters": sum(p.numel() for p in model.reader.parameters()),
                "n_context": model.n_read,
                "num_beams": config.inference.num_beams,
                "text_maxlength": config.inference.text_maxlength or config.reader.text_maxlength,
                "generation_max_length": config.inference.generation_max_length,
            },
            "retriever": {
                "model": config.retriever.model,
                "tied": model.retriever.tied,
                "passage_fingerprint": passage_fingerprint,
            },
            "index": {
                "path": str(index.folder),
                "spec": manifest.spec,
                "passages": len(index),
                "total": manifest.total,
                "dead_rows": manifest.dead_rows,
                "dim": manifest.dim,
                "generation": manifest.generation,
                "segments": len(manifest.segments),
                "compactions": self.compactions,
                "auto_compact": self.auto_compact,
                "encoder_fingerprint": manifest.encoder_fingerprint,
                "encoder": manifest.encoder.source,
            },
            "device": str(next(model.reader.parameters()).device),
        }
