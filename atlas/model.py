"""AtlasModel: a retriever, an index and a FiD reader, wired together (and nothing more); the
module the Python API (`atlas.Atlas`), training, evaluation and serving hold.

`AtlasModel.losses(examples)` is one training step's forward pass: retrieve `retriever.n_context`
passages per query, let the reader read the first `reader.n_context` of them, recompute the
retriever scores with the current encoders, and add the retriever loss (whose gold scores
come from the reader under no-grad). `AtlasModel.read(queries, passages)` is the one answer path:
every front end (Python, `atlas ask|evaluate|serve`, the quickstart, the benches) generates through it,
with the `inference` settings.

Shapes: B examples, K passages, L reader tokens per passage, T target tokens, d retriever dim.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from atlas.config import IndexConfig, InferenceConfig, ReaderConfig, RetrieverConfig
from common.modeling import eval_mode
from reader.dispersion_loss import mean_pairwise_cosine_distance
from reader.fid import IGNORE_INDEX, FiDReader
from reader.inputs import encode_reader_inputs, encode_targets
from reader.int8_decoding import answering_plan
from reader.span_constraint import PassageSpanConstraint, copied_spans
from reader.surface import decode_answers, decoding_is_lossless
from retriever.losses import RetrieverLoss
from retriever.null_document import is_null_document, null_document, with_null_document
from retriever.retriever import Retriever
from tasks.base import Example
from tasks.passage import Passage

if TYPE_CHECKING:  # atlas.index_api imports nothing heavy, but the model only holds one
    from atlas.index_api import Index

# every task's target is "<extra_id_0> {answer}" (T5's span-corruption format): the answer follows it
ANSWER_SENTINEL = "<extra_id_0>"


def template_fields(passages: list[list[Passage]] | None) -> list[list[dict[str, str]]] | None:
    """The passages as the reader's functions take them: per example, each passage's text fields
    (`Passage.fields`, what `reader.passage_format` may name). None stays None (closed book)."""
    return None if passages is None else [[p.fields() for p in ps] for ps in passages]


def passage_log_prior(
    passages: list[list[Passage]], n_passages: int, temperature: float, weight: float
) -> torch.Tensor | None:
    """The retrieval prior of the passages read: weight · log softmax_k(score_k / temperature) over each
    example's passages (their retrieval `score`s), → (B, n_passages), 0 for the padding slots of an
    example with fewer passages; None when some passage has no score (given, not retrieved)."""
    if any(p.score is None for ps in passages for p in ps):
        return None
    prior = torch.zeros(len(passages), n_passages, dtype=torch.float64)
    for row, read in enumerate(passages):
        if read:
            scores = torch.tensor([p.score for p in read[:n_passages]], dtype=torch.float64)
            prior[row, : len(scores)] = weight * torch.log_softmax(scores / temperature, dim=0)
    return prior.float()


@dataclass
class Reading:
    """What the reader made of a batch: `texts[b]`, the generated text of example b as the reader's tokenizer
    decodes it (sentinels kept, for the task's `postprocess`); `attention` (B, K), each passage's share of the
    decoder's cross-attention while it wrote the answer (rows sum to 1 over the passages read, less the null
    document's share where it is read), when asked; `copied[b]`, where decoding was span-constrained (and the
    tokenizer gives character offsets), the places in example b's passages that its answer's ids stand
    (`reader.span_constraint.copied_spans`: passage index, field, start, end), else None."""

    texts: list[str]
    attention: torch.Tensor | None = None
    copied: list[list[tuple[int, str, int, int]]] | None = None


class AtlasModel(nn.Module):
    """Retriever + index + FiD reader.

    Args (keyword-only, built by `atlas.assembly`; `atlas.loading.load_model` is the way to one):
        reader: the FiD reader; reader_tokenizer: its tokenizer (T5 sentinels, eos appended).
        retriever: query/passage encoders, or None for closed-book / given-passages runs.
        index: the `atlas.Index` it searches (its latest commit: an edit is seen by the next search), or None.
        retriever_loss: the loss that trains the retriever through the reader.
        reader_config, retriever_config, index_config: the run's settings (read-only).
        inference_config: how it answers (passages read, input length, decoding, precision).
    """

    def __init__(
        self,
        *,
        reader: FiDReader,
        reader_tokenizer,
        retriever: Retriever | None,
        index: Index | None,
        retriever_loss: RetrieverLoss,
        reader_config: ReaderConfig,
        retriever_config: RetrieverConfig,
        index_config: IndexConfig,
        inference_config: InferenceConfig | None = None,
        closed_book: bool = False,
    ):
        super().__init__()
        self.reader = reader
        self.reader_tokenizer = reader_tokenizer
        self.retriever = retriever
        self.index = index
        self.retriever_loss = retriever_loss
        self.reader_config = reader_config
        self.retriever_config = retriever_config
        self.index_config = index_config
        self.inference_config = inference_config or InferenceConfig()
        self.closed_book = closed_book
        self._lossless_tokenizer = decoding_is_lossless(reader_tokenizer)

    @property
    def restores_surface(self) -> bool:
        """Whether answers are given their spelling in the passages read (`inference.restore_surface`; by
        default where the tokenizer's decoding loses the passage's characters: a WordPiece one lower-cases and
        splits punctuation; a lossless one, T5's SentencePiece, is decoded as it is, as the reference does)."""
        setting = self.inference_config.restore_surface
        return not self._lossless_tokenizer if setting is None else setting

    # ------------------------------------------------------------------ retrieval
    @property
    def passage_index(self):
        """The `retriever.index.PassageIndex` searched: the last commit of `index` (None without one)."""
        return None if self.index is None else self.index.current

    @property
    def trains_retriever(self) -> bool:
        """Whether this run sends a retriever loss (the loss is not `none` and there is an index)."""
        return self.retriever is not None and self.retriever_loss.trains_retriever and not self.closed_book

    @torch.no_grad()
    def retrieve(self, examples: list[Example], k: int) -> list[list[Passage]]:
        """The top-k passages for each example, best first, each with its `score` (and `row`).

        An example's own source passage (`source_id`, pretext tasks) is dropped after
        over-retrieving by `index.filtering_overretrieve_ratio`. With `reencode_candidates`
        > k, that many candidates are re-scored with the current passage encoder (between
        index refreshes the stored embeddings are stale). An example's `evidence` passage is read
        as the example gives it (e.g. an excerpt): in place of its own retrieved copy, or of the
        k-th passage where the search missed it.
        """
        if self.index is None or self.retriever is None:
            raise ValueError(
                "this model has no index to retrieve from: give one (Atlas.from_pretrained(..., index=INDEX), "
                "--index DIR, or index.path in a recipe)"
            )
        filtering = any(e.source_id for e in examples)
        n = k * self.index_config.filtering_overretrieve_ratio if filtering else k
        n = max(n, self.index_config.reencode_candidates)
        vectors = self.retriever.embed_queries([e.query for e in examples])  # (B, d)
        hits = self.passage_index.search(vectors, n)
        results = []
        for example, example_hits, query_vector in zip(examples, hits, vectors):
            passages = [h for h in example_hits if not example.source_id or h.id != example.source_id]
            if self.index_config.reencode_candidates > k and passages:
                passage_vectors = self.retriever.embed_passages([p.fields() for p in passages])  # (n, d)
                scores = passage_vectors @ query_vector
                order = np.argsort(-scores, kind="stable")
                passages = [replace(passages[i], score=float(scores[i])) for i in order]
            passages = passages[:k]
            if example.evidence is not None:  # read as given: in place of its own copy, else of the k-th
                evidence = self._scored_evidence(example.evidence, query_vector)
                slot = next((n for n, p in enumerate(passages) if p.id == evidence.id), len(passages[: k - 1]))
                passages = passages[:slot] + [evidence] + passages[slot + 1 :]
            results.append(passages)
        return results

    def _scored_evidence(self, evidence: Passage, query_vector: np.ndarray) -> Passage:
        """`evidence` with its retrieval score for `query_vector` (d,): read from the index's stored
        embedding where the index holds that passage (and no reranking asks for fresh ones),
        else encoded now; with its index position (`row`) where it has one."""
        index = self.passage_index
        position = index.position_of(evidence.id)
        if position is not None and index.vectors is not None and not self.index_config.reencode_candidates:
            vector = index.embeddings([position])[0]
        else:
            vector = self.retriever.embed_passages([evidence.fields()])[0]
        return replace(evidence, score=float(vector @ query_vector), row=evidence.row if position is None else position)

    def retriever_scores(self, queries: list[str], passages: list[list[Passage]]) -> torch.Tensor:
        """s(q, d_k) = E_q(q) · E_p(d_k) with the current encoders: → (B, K), with gradient.

        K = max(1, the longest passage list), as in `reader_inputs`: an example with fewer
        passages is padded with zero scores at k ≥ len(passages[b]); `passage_presence` gives
        the matching (B, K) mask, with which the retriever loss leaves those entries out.

        The query side always runs with gradient. The passage side runs with gradient only
        when the passage encoder is trained; a frozen one is read from the index's stored
        embeddings where it kept them (identical to re-encoding), else re-encoded under no-grad.
        The null document (`retriever.null_document`) is scored as the passage encoder embeds an empty
        passage: s(q, ∅) = E_q(q) · E_p(∅).
        """
        if len(queries) != len(passages):
            raise ValueError(f"{len(queries)} queries but {len(passages)} passage lists")
        query_vectors = self.retriever.encode_queries(queries)  # (B, d)
        n_passages = max(1, max((len(ps) for ps in passages), default=0))
        # (slot in the flattened (B·K) grid, passage); the null document is embedded once for all its slots
        placed = [(b * n_passages + k, p) for b, ps in enumerate(passages) for k, p in enumerate(ps)]
        real = [(slot, p) for slot, p in placed if not is_null_document(p)]
        null_slots = [slot for slot, p in placed if is_null_document(p)]
        if not placed:  # nothing to score; every entry is padding
            return query_vectors.new_zeros(len(queries), n_passages) + 0.0 * query_vectors.sum()
        padded = query_vectors.new_zeros(len(queries) * n_passages, query_vectors.shape[-1])
        if real:
            flat = [p for _, p in real]
            passage_vectors = self._passage_vectors(flat, query_vectors.device).to(query_vectors.dtype)  # (ΣK_b, d)
            slots = torch.tensor([slot for slot, _ in real], device=padded.device)
            padded = padded.index_copy(0, slots, passage_vectors)
        if null_slots:  # E_p(∅), as any passage: with gradient where the passage encoder trains
            null_vector = self._passage_vectors([null_document()], query_vectors.device).to(query_vectors.dtype)
            slots = torch.tensor(null_slots, device=padded.device)
            padded = padded.index_copy(0, slots, null_vector.expand(len(null_slots), -1))
        # Ragged lists → (B, K, d), zero rows for absent passages (their scores are 0 and masked).
        padded = padded.view(len(queries), n_passages, -1)
        return torch.einsum("bd,bkd->bk", query_vectors, padded)

    def _passage_vectors(self, passages: list[Passage], device: torch.device) -> torch.Tensor:
        """E_p(d) of each passage: → (N, d). With gradient when the passage encoder is trained; a frozen one
        is read from the index's stored embeddings where it kept them all, else re-encoded under no-grad."""
        if any(p.requires_grad for p in self.retriever.passage_encoder.parameters()):
            return self.retriever.encode_passages([p.fields() for p in passages])
        index = self.passage_index
        if index is not None and index.vectors is not None and all(p.row is not None for p in passages):
            return torch.from_numpy(index.embeddings([p.row for p in passages])).to(device)
        with torch.no_grad():
            return self.retriever.encode_passages([p.fields() for p in passages])

    @staticmethod
    def passage_presence(passages: list[list[Passage]], device: torch.device | None = None) -> torch.Tensor:
        """(B, K) bool, True where example b has a k-th passage (K as in `retriever_scores`)."""
        n_passages = max(1, max((len(ps) for ps in passages), default=0))
        lengths = torch.tensor([len(ps) for ps in passages], device=device)
        return torch.arange(n_passages, device=device).unsqueeze(0) < lengths.unsqueeze(1)

    # ------------------------------------------------------------------ reader inputs
    @property
    def n_read(self) -> int:
        """Passages read per question when answering (`inference.n_context`, else `reader.n_context`)."""
        return self.inference_config.n_context or self.reader_config.n_context

    def reader_inputs(
        self, queries: list[str], passages: list[list[Passage]] | None, *, answering: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokenise each (query, passage) pair: → input_ids, attention_mask, each (B, K, L), L at most
        `reader.text_maxlength` (training) or `inference.text_maxlength` (`answering`, where set).

        Closed-book (passages None): K = 1 and the reader reads the query alone. Examples with
        fewer passages than the longest list get fully masked rows.
        """
        max_length = self.reader_config.text_maxlength
        if answering and self.inference_config.text_maxlength:
            max_length = self.inference_config.text_maxlength
        input_ids, attention_mask = encode_reader_inputs(
            self.reader_tokenizer,
            queries,
            template_fields(passages) or [[] for _ in queries],
            max_length,
            self.reader_config.passage_format,
        )
        device = self.reader.seq2seq.device
        return input_ids.to(device), attention_mask.to(device)

    def target_labels(self, targets: list[str]) -> torch.Tensor:
        """Tokenise targets: → (B, T) ids with IGNORE_INDEX (-100) at padding."""
        labels = encode_targets(self.reader_tokenizer, targets, self.reader_config.answer_maxlength)
        return labels.to(self.reader.seq2seq.device)

    def reads_null_document(self, *, answering: bool) -> bool:
        """Whether the null document joins the passages read (`retriever.null_document`: "train" in
        training, "always" in training and when answering)."""
        setting = self.retriever_config.null_document
        return setting == "always" or (setting == "train" and not answering)

    def passages_for(self, examples: list[Example], k: int) -> list[list[Passage]] | None:
        """Given passages when examples carry them, none when closed-book, else retrieved ones."""
        if self.closed_book:
            return None
        if all(e.passages for e in examples):
            return [list(e.passages[:k]) for e in examples]
        return self.retrieve(examples, k)

    # ------------------------------------------------------------------ training
    def forward(self, examples: list[Example], targets: list[str]) -> dict[str, torch.Tensor]:
        """`losses` (so that DistributedDataParallel can wrap the whole model)."""
        return self.losses(examples, targets)

    def losses(self, examples: list[Example], targets: list[str]) -> dict[str, torch.Tensor]:
        """One training forward pass: → {"reader": scalar, "retriever": scalar, "total": scalar}.

        The reader reads the first `reader.n_context` passages; the retriever loss covers all
        `retriever.n_context`; with `retriever.null_document` on, the null document joins both lists (first)
        and its score joins the retriever loss's softmax. When the reader's encoder has no dropout
        (`reader.dropout: 0`, or `reader.encoder_dropout: false`), the training pass's encoder states double
        as the eval-mode states of the gold scores, and only scored passages the reader did not read are
        encoded again.
        """
        n_retrieved = max(self.retriever_config.n_context, self.reader_config.n_context)
        passages = self.passages_for(examples, n_retrieved)
        queries = [e.query for e in examples]
        labels = self.target_labels(targets)
        null = passages is not None and self.reads_null_document(answering=False)
        read = None if passages is None else [ps[: self.reader_config.n_context] for ps in passages]
        if null:
            read = with_null_document(read)
        input_ids, attention_mask = self.reader_inputs(queries, read)
        encoder_states = self.reader.encode(input_ids, attention_mask)  # (B, K, L, H)
        mu = self.reader_config.dispersion_weight
        output = self.reader(
            input_ids=input_ids,
            attention_mask=attention_mask,
            labels=labels,
            encoder_states=encoder_states,
            output_hidden_states=mu > 0,
        )
        losses = {"reader": output.loss}
        total = output.loss
        if mu > 0:
            dispersion = mean_pairwise_cosine_distance(output.decoder_hidden_states[-1], labels != IGNORE_INDEX)
            losses["dispersion"] = dispersion
            total = total - mu * dispersion
        if self.trains_retriever and passages is not None:
            scored = [ps[: self.retriever_config.n_context] for ps in passages]
            if null:  # first in both lists, so that the shorter is still a prefix of the longer
                scored = with_null_document(scored)
            scores = self.retriever_scores(queries, scored)  # (B, K)
            n_read, n_scored = input_ids.shape[1], scores.shape[1]
            if n_scored <= n_read:  # the scored passages are the first ones the reader read
                gold_ids, gold_mask = input_ids[:, :n_scored], attention_mask[:, :n_scored]
            else:
                gold_ids, gold_mask = self.reader_inputs(queries, scored)
            gold_states = self._gold_encoder_states(encoder_states, gold_ids, gold_mask)
            # Padding passages (an example with fewer than K) get no probability on either
            # side; an example that closed-book reads its query alone has no passage at all.
            losses["retriever"] = self.retriever_loss(
                self.reader,
                scores,
                gold_ids,
                gold_mask,
                labels,
                dim=self.retriever.dim,
                encoder_states=gold_states,
                present=self.passage_presence(scored, scores.device),
            )
            total = total + losses["retriever"]
        losses["total"] = total
        return losses

    def _gold_encoder_states(
        self, read_states: torch.Tensor, gold_ids: torch.Tensor, gold_mask: torch.Tensor
    ) -> torch.Tensor | None:
        """Eval-mode encoder states (B, K_s, L_s, H) of the passages the retriever loss scores, reusing
        the training pass's states (B, K_r, L_r, H) of those the reader read when the encoder has no
        dropout (then they are the eval-mode states); only passages beyond the reader's are encoded
        here, in eval mode, under no-grad. None when nothing can be reused (the loss encodes them all)."""
        if not self.reader.encoder_is_dropout_free():
            return None
        n_scored, length = gold_ids.shape[1], gold_ids.shape[2]
        n_reused = min(read_states.shape[1], n_scored)
        reused = read_states[:, :n_reused].detach()
        if n_reused == n_scored and reused.shape[2] == length:
            return reused
        # passages padded to different lengths in the two tokenisations: pad the reused states
        # (padded positions are masked everywhere downstream)
        states = reused.new_zeros(reused.shape[0], n_scored, length, reused.shape[-1])
        states[:, :n_reused, : reused.shape[2]] = reused[:, :, :length]
        if n_scored > n_reused:
            with eval_mode(self.reader), torch.no_grad():
                states[:, n_reused:] = self.reader.encode(
                    gold_ids[:, n_reused:], gold_mask[:, n_reused:], precision=self.retriever_loss.gold_precision
                )
        return states

    # ------------------------------------------------------------------ inference
    @torch.no_grad()
    def read(
        self, queries: list[str], passages: list[list[Passage]] | None, *, with_attention: bool = False
    ) -> Reading:
        """The one answer path: generate an answer for each query from its passages (None: closed book).

        The reader reads every passage given (callers pass the first `n_read`, or a request's k), and the null
        document before them where `retriever.null_document` is "always"; decoding follows `inference`. With
        `with_attention`, each passage given gets its share of the decoder's cross-attention while it wrote
        the answer (teacher-forcing the generated ids over the same encoder states); the null document's
        share is left out, so a row then sums to less than 1.
        """
        null = passages is not None and self.reads_null_document(answering=True)
        read = self._with_scored_null_document(queries, passages) if null else passages
        input_ids, attention_mask = self.reader_inputs(queries, read, answering=True)  # (B, K, L)
        states = self.encode_for_answers(input_ids, attention_mask)  # (B, K, L, H)
        generated = self.generate(input_ids, attention_mask, read, encoder_states=states)  # (B, T')
        texts = self.decode(generated, read)
        copied = None
        if self.inference_config.span_answers and passages is not None and self.reader_tokenizer.is_fast:
            copied = copied_spans(self.reader_tokenizer, self._answer_ids(generated), template_fields(passages))
        attention = None
        if with_attention:
            labels = generated[:, 1:].clone()
            labels[labels == self.reader.seq2seq.config.pad_token_id] = IGNORE_INDEX
            scores = self.reader.cross_attention_scores(states, attention_mask, labels, input_ids=input_ids)
            scores = scores.float().cpu()  # (B, K)
            totals = scores.sum(dim=1, keepdim=True)
            attention = torch.where(totals > 0, scores / totals.clamp_min(1e-30), scores)
            if null:  # not evidence: the passages given keep their shares
                attention = attention[:, 1:]
        return Reading(texts, attention, copied)

    def _answer_ids(self, generated: torch.Tensor) -> list[list[int]]:
        """(B, T') generated ids → each answer's ids: after the decoder start token and the answer prefix (as the
        span constraint forces it), before `</s>`."""
        prefix = self.reader_tokenizer(ANSWER_SENTINEL, add_special_tokens=False)["input_ids"]
        eos = self.reader_tokenizer.eos_token_id
        answers = []
        for row in generated[:, 1:].tolist():
            row = row[: row.index(eos)] if eos in row else row
            answers.append(row[len(prefix) :] if row[: len(prefix)] == prefix else row)
        return answers

    def _with_scored_null_document(self, queries: list[str], passages: list[list[Passage]]) -> list[list[Passage]]:
        """`passages` with the null document first, scored (s(q, ∅)) where the retrieval prior weighs the
        passages' scores and a retriever can give it one (else the prior is off, as for given passages)."""
        read = with_null_document(passages)
        if self.inference_config.retrieval_prior and self.retriever is not None:
            null_vector = self.retriever.embed_passages([null_document().fields()])[0]  # E_p(∅), (d,)
            scores = self.retriever.embed_queries(queries) @ null_vector  # s(q, ∅) = E_q(q) · E_p(∅), (B,)
            read = [[replace(ps[0], score=float(score)), *ps[1:]] for ps, score in zip(read, scores)]
        return read

    def decode(self, generated: torch.Tensor, passages: list[list[Passage]] | None) -> list[str]:
        """(B, T') generated ids → their texts, sentinels kept (for the task's `postprocess`), respelled as the
        passages read write them where `restores_surface`; with `inference.reference_decoding` (an imported
        reference model), as the reference decoded them: special tokens dropped, transformers 4's clean-up."""
        fields = template_fields(passages) if self.restores_surface else None
        return decode_answers(
            self.reader_tokenizer,
            generated,
            fields,
            skip_special_tokens=False,
            as_reference=self.inference_config.reference_decoding,
        )

    @torch.no_grad()
    def encode_for_answers(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, K, L) reader inputs → (B, K, L, H) encoder states at `inference.precision`'s encoder precision."""
        precision, _ = answering_plan(self.inference_config.precision, self.reader.seq2seq.device)
        return self.reader.encode(input_ids, attention_mask, precision=precision)

    @torch.no_grad()
    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        passages: list[list[Passage]] | None,
        encoder_states: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Decode answers as `inference` says (`num_beams`, `length_penalty`, `span_answers`,
        `generation_max_length`, `precision`, `retrieval_prior`).

        Args:
            input_ids, attention_mask: (B, K, L) from `reader_inputs(queries, passages)`.
            passages: the B lists of passages read (None: closed book, never constrained).
            encoder_states: (B, K, L, H) from `encode_for_answers`, reused instead of encoding again.
        Returns:
            (B, T') generated ids starting with the decoder start token.
        """
        settings = self.inference_config
        constraint = None
        if settings.span_answers and passages is not None:
            constraint = PassageSpanConstraint.from_passages(
                self.reader_tokenizer,
                template_fields(passages),
                answer_prefix=ANSWER_SENTINEL,
                vocab_size=self.reader.seq2seq.config.vocab_size,
            )
        prior = None
        if settings.retrieval_prior and passages is not None:
            prior = passage_log_prior(
                passages, input_ids.shape[1], settings.prior_temperature, settings.retrieval_prior
            )
        return self.reader.generate(
            input_ids,
            attention_mask,
            max_length=settings.generation_max_length,
            num_beams=settings.num_beams,
            length_penalty=settings.length_penalty,
            encoder_states=encoder_states,
            prefix_allowed_tokens_fn=constraint,
            precision=settings.precision,
            passage_log_prior=prior,
        )

    @torch.no_grad()
    def option_logits(
        self, examples: list[Example], letters: list[str], passages: list[list[Passage]] | None
    ) -> torch.Tensor:
        """Multiple choice: logits of each option letter at the first answer position: → (B, n)."""
        option_ids = []
        for letter in letters:
            ids = self.reader_tokenizer(letter, add_special_tokens=False)["input_ids"]
            if len(ids) != 1:
                raise ValueError(f"option label {letter!r} is not a single reader token ({ids})")
            option_ids.append(ids[0])
        if passages is not None and self.reads_null_document(answering=True):
            passages = with_null_document(passages)
        input_ids, attention_mask = self.reader_inputs([e.query for e in examples], passages, answering=True)
        sentinel = self.reader_tokenizer.convert_tokens_to_ids(ANSWER_SENTINEL)
        prefix = torch.full((len(examples), 1), sentinel, dtype=torch.long, device=self.reader.seq2seq.device)
        return self.reader.score_options(input_ids, attention_mask, torch.tensor(option_ids), prefix_ids=prefix)
