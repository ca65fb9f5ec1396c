"""`atlas.Atlas`: the model a user holds. It loads (`from_pretrained`), answers with its evidence (`answer`),
fine-tunes (`fit`, the training recipe), evaluates (`evaluate`, the task's metrics in percent) and saves
(`save_pretrained`, a folder a Hugging Face Hub model repository holds as it is). The command line, the
server, the quickstart and the benches are callers of it.

    import atlas
    index = atlas.Index.load("runs/idx")
    model = atlas.Atlas.from_pretrained("atlas-reader", index=index)
    model.answer("What is the capital of Biole?").text
"""

from __future__ import annotations

import dataclasses
import html
import logging
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import yaml

from atlas.config import AtlasConfig, apply_overrides, save_config
from atlas.evaluate import evaluate
from atlas.index_api import Index
from atlas.loading import ModelSource, load_model, model_spec
from atlas.quiet import quiet_libraries
from atlas.training.loop import train as run_recipe
from common.io import atomic_directory, atomic_write_text
from common.limits import MAX_ASK_K, check_k, check_question
from common.progress import progress_bar
from tasks.base import Example, get_task
from tasks.citations import Citation, supported_answer
from tasks.passage import Passage, shorten

if TYPE_CHECKING:  # the module itself (torch) loads with the first model
    from atlas.model import AtlasModel

logger = logging.getLogger(__name__)

MAX_SHOWN = 3  # passages an Answer's repr names


@dataclass(repr=False)
class Answer:
    """One answer. `text`: the answer as the task scores it; `passages`: the passages the reader read (id,
    title, text, retrieval `score`), best first; `attention`: each passage's share of the reader's
    cross-attention while it wrote the answer (sums to 1; only when asked for); `generation`: the index
    commit it was answered from (None without an index); `citations`: where the answer's words stand in the
    passages read (`tasks.citations.Citation`: passage id, title or text, character offsets), best first."""

    question: str
    text: str
    passages: list[Passage]
    attention: list[float] | None = None
    generation: int | None = None
    citations: list[Citation] = field(default_factory=list)

    @property
    def supported(self) -> bool:
        """Whether a passage read holds the answer (it is cited); False for a closed-book answer."""
        return bool(self.citations)

    def __repr__(self) -> str:
        """Short, for a console: the question, the answer, where it is cited, the passages read (id, score)."""
        read = ", ".join(
            f"{p.id!r}" + ("" if p.score is None else f" ({p.score:.3f})") for p in self.passages[:MAX_SHOWN]
        )
        more = f", … {len(self.passages) - MAX_SHOWN} more" if len(self.passages) > MAX_SHOWN else ""
        cited = ""
        if self.citations:
            best = self.citations[0]
            others = f" +{len(self.citations) - 1}" if len(self.citations) > 1 else ""
            cited = f", cited={best.passage_id!r}:{best.field}[{best.start}:{best.end}]{others}"
        return f"Answer(question={shorten(self.question)!r}, text={self.text!r}{cited}, passages=[{read}{more}])"

    def _repr_html_(self) -> str:
        """For a notebook: the question, the answer in bold, then each passage read (title, text start, score,
        attention share where asked)."""
        rows = []
        for n, p in enumerate(self.passages):
            notes = [] if p.score is None else [f"score {p.score:.3f}"]
            notes += [] if self.attention is None else [f"attention {self.attention[n]:.0%}"]
            small = f" <small>({' · '.join(notes)})</small>" if notes else ""
            spans = [c for c in self.citations if c.passage_id == p.id]
            title = _highlighted(p.title or p.id, [c for c in spans if c.field == "title"] if p.title else [])
            text = _highlighted(p.text, [c for c in spans if c.field == "text"], limit=None if spans else 160)
            rows.append(f"<li><b>{title}</b>{small}: {text}</li>")
        return (
            f"<div><div>Q: {html.escape(self.question)}</div><div>A: <b>{html.escape(self.text)}</b></div>"
            f"<ol>{''.join(rows)}</ol></div>"
        )


def _highlighted(text: str, spans: list[Citation], limit: int | None = None) -> str:
    """`text` escaped as HTML with the cited `spans` in <mark>; shortened to `limit` characters where nothing is
    marked."""
    if not spans:
        return html.escape(shorten(text, limit) if limit else text)
    out, at = [], 0
    for span in sorted(spans, key=lambda c: c.start):
        if span.start < at:  # overlapping occurrences: the first marks them
            continue
        out += [html.escape(text[at : span.start]), f"<mark>{html.escape(text[span.start : span.end])}</mark>"]
        at = span.end
    return "".join(out) + html.escape(text[at:])


class Atlas:
    """A retrieval-augmented reader and the index it reads.

    Args:
        model: the built `atlas.model.AtlasModel` (retriever, reader, tokenizer).
        config: its resolved config (`inference`: how it answers; `task`: how questions are posed and scored).
        source: where its weights came from (for `save_pretrained`'s model card).

    Its `index` is the model's (`model.index`, one object): the `Index` it retrieves from, or None (a
    closed-book model, `task.closed_book`, needs none; another is given one later: `atlas_model.index =
    atlas.Index.load(…)`).
    """

    def __init__(self, model: AtlasModel, config: AtlasConfig, *, source: ModelSource | None = None):
        self.model = model
        self.config = config
        self.source = source
        self.task = get_task(config.task.name, **config.task.options)

    @property
    def index(self) -> Index | None:
        """The `Index` this model retrieves from (the model's own: `self.model.index`), or None."""
        return self.model.index

    @index.setter
    def index(self, index: Index | None) -> None:
        self.model.index = index

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls,
        name: str | os.PathLike,
        *,
        index: Index | str | os.PathLike | None = None,
        task: str | None = None,
        device=None,
        overrides: Sequence[str] = (),
        verbose: bool = False,
    ) -> Atlas:
        """Load a model: `name` is a shipped reader ("atlas-reader"), a reader folder, a run or checkpoint
        folder (`atlas train`, `save_pretrained`, `atlas import`), a reader preset or a Hub id ("org/name").

        `index`: an `Index` (shared: its edits are seen at once), or an index folder; default: the run's own
        (a reader has none). `task`: the task its questions are posed and scored as (default: the run's, qa
        for a reader). `overrides`: dotted settings, e.g. `["inference.num_beams=1"]`. Loading builds nothing
        and writes nothing."""
        with quiet_libraries(verbose):
            spec = model_spec(
                name, index=index.path if isinstance(index, Index) else index, task=task, overrides=list(overrides)
            )
            model = load_model(spec, index=index if isinstance(index, Index) else None, device=device)
        return cls(model, spec.config, source=spec.source)

    # ------------------------------------------------------------------ answering
    def answer(
        self,
        question: str | Sequence[str],
        *,
        k: int | None = None,
        with_attention: bool = False,
        batch_size: int | None = None,
        progress: bool | None = None,
    ) -> Answer | list[Answer]:
        """Answer a question (→ `Answer`) or a list of them (→ a list), reading the top `k` retrieved passages
        (default: `inference.n_context`); `with_attention` adds each passage's share of the reader's
        attention. Questions are posed as the task poses them (qa: "question: … answer: <extra_id_0>").
        A list is answered `batch_size` questions at a time (default `evaluation.batch_size`), with a
        progress bar when it takes more than one batch (`progress`: True or False to choose)."""
        single = isinstance(question, str)
        if not single and not (isinstance(question, Sequence) and not isinstance(question, (bytes, Mapping))):
            raise TypeError(
                f"Atlas.answer takes a question (str) or a list of questions (list[str]), not "
                f"{type(question).__name__}: {question!r:.80}"
            )
        questions = [question] if single else list(question)
        if not questions:
            raise ValueError("Atlas.answer: no questions given (an empty list)")
        for n, q in enumerate(questions):
            check_question(q, "the question" if single else f"question {n}")
        examples = [
            Example(id=str(n), query=self.task.query(q), target=None, answers=[]) for n, q in enumerate(questions)
        ]
        answers = self.answer_examples(
            examples,
            k=k,
            with_attention=with_attention,
            questions=questions,
            batch_size=batch_size,
            progress=progress,
        )
        return answers[0] if single else answers

    def answer_examples(
        self,
        examples: list[Example],
        *,
        k: int | None = None,
        with_attention: bool = False,
        questions: Sequence[str] | None = None,
        batch_size: int | None = None,
        progress: bool | None = None,
    ) -> list[Answer]:
        """`answer` for examples already in the task's form (their `query`; given `passages` are read instead
        of retrieved ones), `batch_size` at a time (default `evaluation.batch_size`), with a progress bar over
        more than one batch unless `progress` is False; `questions` names them in the answers (default: their
        metadata's question)."""

        model = self.model
        if k is not None and k != model.n_read:  # a k asked for is held to the limit; the model's own is its own
            check_k(k, MAX_ASK_K)
        k = k or model.n_read
        size = batch_size if batch_size is not None else self.config.evaluation.batch_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {size!r}")
        generation = self.index.manifest.generation if self.index is not None else None
        if questions is None:
            questions = [e.metadata.get("question", e.query) for e in examples]
        require_support = self.config.inference.require_support
        answers = []
        starts = range(0, len(examples), size)
        show = progress if progress is not None else len(starts) > 1  # a single batch: nothing to follow
        for start in progress_bar(starts, desc="answering", unit="batch", disable=not show):
            batch = examples[start : start + size]
            with torch.no_grad():
                passages = model.passages_for(batch, k)
                reading = model.read([e.query for e in batch], passages, with_attention=with_attention)
            for n, (example, text) in enumerate(zip(batch, reading.texts)):
                read = [] if passages is None else list(passages[n])
                attention = None if reading.attention is None else [float(a) for a in reading.attention[n, : len(read)]]
                answer, cited = self.task.postprocess(example, text), []
                copied = None if reading.copied is None else reading.copied[n]
                if self.task.cites_passages:
                    answer, cited = supported_answer(
                        answer, read, attention, require_support=require_support, copied=copied
                    )
                answers.append(Answer(questions[start + n], answer, read, attention, generation, cited))
        return answers

    def retrieve(self, examples: list[Example], k: int) -> list[list[Passage]]:
        """The top-k passages of each example (given passages where it carries them), from the index's latest
        commit; [] per example when closed book."""
        passages = self.model.passages_for(examples, k)
        return passages if passages is not None else [[] for _ in examples]

    # ------------------------------------------------------------------ evaluating and fine-tuning
    def evaluate(
        self,
        data: str | os.PathLike,
        *,
        max_examples: int | None = None,
        out_dir: str | os.PathLike | None = None,
        progress: bool = True,
    ) -> dict[str, float]:
        """Answer every example of `data` (the task's format, each with its gold answers) and score them with
        the task's metrics → {metric: value in percent}, primary first. `out_dir`: where to write the
        predictions and metrics (default: nowhere)."""

        settings = self.config.evaluation
        if max_examples is not None:
            settings = dataclasses.replace(settings, max_examples=max_examples)
        with quiet_libraries():
            return evaluate(self.model, self.task, data, settings, out_dir=out_dir, show=progress)

    def fit(
        self,
        train: str | os.PathLike | Sequence[str | os.PathLike],
        *,
        steps: int = 100,
        eval_data: str | os.PathLike | None = None,
        output_dir: str | os.PathLike | None = None,
        overrides: Sequence[str] = (),
        progress: bool = True,
    ) -> dict:
        """Fine-tune on the examples of `train` (the task's format) for `steps` steps, with this model's
        training settings (`config.training`; `overrides` such as `["training.lr=1e-4"]`), by the training
        recipe (`atlas.training.loop`); the model is trained in place, and keeps its own settings (the
        overrides are the fit's). `output_dir`: the run folder for its log and checkpoint (default: a temporary
        folder, removed at the end). → the recipe's summary ({"step", "losses", "eval", "checkpoint"}); with
        `eval_data`, "eval" holds its metrics."""

        files = [train] if isinstance(train, (str, os.PathLike)) else list(train)
        temporary = tempfile.mkdtemp(prefix="atlas-fit-") if output_dir is None else None
        config = dataclasses.replace(
            self.config,
            task=dataclasses.replace(
                self.config.task,
                train_data=[str(f) for f in files],
                eval_data=[str(eval_data)] if eval_data is not None else [],
            ),
            training=dataclasses.replace(self.config.training, steps=steps, output_dir=str(output_dir or temporary)),
            index=dataclasses.replace(
                self.config.index, path=str(self.index.path) if self.index is not None else None, corpus=None
            ),
        )
        config = apply_overrides(config, list(overrides))
        try:
            with quiet_libraries():
                summary = run_recipe(config, model=self.model, progress=progress)
        finally:
            if temporary is not None:
                shutil.rmtree(temporary, ignore_errors=True)
        if temporary is not None:  # nothing of the run is left: say so
            summary = {k: v for k, v in summary.items() if k != "disk"} | {"checkpoint": None}
        self.model.eval()  # this model's settings are its own still: the fit's overrides were for the fit
        return summary

    # ------------------------------------------------------------------ saving
    def save_pretrained(self, path: str | os.PathLike, *, overwrite: bool = False) -> Path:
        """Write the model to the folder `path` (atomically): `config.yaml` (the resolved config, with the
        `inference` settings it answers with), `reader/` and `retriever/` (safetensors, tokenizers, configs)
        and a `README.md` model card with its Hub metadata. `Atlas.from_pretrained(path, index=…)` loads it;
        a Hub model repository holds it as it is. The index is not copied (its path is recorded)."""
        path = Path(path)
        if path.exists() and not overwrite:
            raise FileExistsError(f"{path} already exists (overwrite=True replaces it)")
        config = self.config
        if self.index is not None:
            index_path = str(self.index.path.resolve())
            config = dataclasses.replace(config, index=dataclasses.replace(config.index, path=index_path))
        config = dataclasses.replace(config, task=dataclasses.replace(config.task, train_data=[], eval_data=[]))
        with quiet_libraries(), atomic_directory(path, overwrite=overwrite) as tmp:
            self.model.reader.save_pretrained(tmp / "reader")
            self.model.reader_tokenizer.save_pretrained(str(tmp / "reader"))
            if self.model.retriever is not None:
                self.model.retriever.save_pretrained(tmp / "retriever")
            save_config(
                dataclasses.replace(config, training=dataclasses.replace(config.training, output_dir=str(path))),
                tmp / "config.yaml",
            )
            atomic_write_text(tmp / "README.md", model_card(self, config))
            readable(tmp)
        return path

    def __repr__(self) -> str:
        where = repr(self.index) if self.index is not None else "no index"
        name = self.source.name if self.source is not None else self.config.reader.model
        return f"Atlas({name!r}, task={self.config.task.name!r}, {where})"


def readable(folder: Path) -> None:
    """Folders 0755 and files 0644 (less what the umask takes): atomic writes make private temporaries, and a
    saved model is for others to read (a shared machine, a Hub upload)."""
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(folder, 0o755 & ~mask)
    for path in folder.rglob("*"):
        os.chmod(path, (0o755 if path.is_dir() else 0o644) & ~mask)


def model_card(model: Atlas, config: AtlasConfig) -> str:
    """A Hub model card: YAML metadata (library, pipeline, tags), then what the model is and how to load it."""

    settings = dataclasses.asdict(config.inference) | {
        "n_context": model.model.n_read,
        "text_maxlength": config.inference.text_maxlength or config.reader.text_maxlength,
    }
    metadata = {
        "library_name": "atlas",
        "pipeline_tag": "question-answering",
        "tags": ["atlas", "retrieval-augmented-generation", "fusion-in-decoder", config.task.name],
    }
    reader = type(model.model.reader.seq2seq).__name__
    parameters = sum(p.numel() for p in model.model.parameters())
    lines = [
        "---",
        yaml.safe_dump(metadata, sort_keys=False).strip(),
        "---",
        "",
        "# An atlas model",
        "",
        (
            f"A Fusion-in-Decoder reader ({reader}, {parameters:,} parameters with its retriever) and the "
            f"retriever ({config.retriever.model}) that feeds it passages, for the `{config.task.name}` task."
        ),
        "",
        "```python",
        "import atlas",
        'index = atlas.Index.load("path/to/index")',
        'model = atlas.Atlas.from_pretrained("THIS-FOLDER-OR-HUB-ID", index=index)',
        'print(model.answer("your question").text)',
        "```",
        "",
        "It answers with these settings (`inference` in config.yaml):",
        "",
        *[f"- `{key}`: {value}" for key, value in settings.items()],
        "",
    ]
    return "\n".join(lines)
