"""Constrained decoding: every generated answer is a span of a passage its question read.

A reader that copies can still splice: "the treaty of rome 1957 and the maastricht treaty of rome 1957
and …" joins two places of a passage and loops, and "8 – 4 – 4 – 4 …" never stops. Where the answer is
known to be a span of the text read (extractive QA: NaturalQuestions, TriviaQA, SQuAD), decoding can
only continue a span that occurs in a passage, or end it at a word boundary. `PassageSpanConstraint` is
the `prefix_allowed_tokens_fn` of Hugging Face's `generate` that enforces it (greedy and beam search);
`StepPrefixConstraint` applies any such function to a whole decoding step at once.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import torch
from transformers import LogitsProcessor

_SEPARATOR = -1  # between the token sequences of an example's passages: no span crosses it


def continuation_token_ids(tokenizer) -> np.ndarray:
    """Ids of the pieces that continue a word (WordPiece `##…`; SentencePiece pieces without `▁` that
    start with a letter or digit): an answer neither starts nor ends before one. → sorted int64 ids."""
    vocab = tokenizer.get_vocab()
    sentencepiece = any(token.startswith("▁") for token in vocab)
    if sentencepiece:
        ids = [i for token, i in vocab.items() if not token.startswith("▁") and token[:1].isalnum()]
    else:
        ids = [i for token, i in vocab.items() if token.startswith("##")]
    return np.array(sorted(ids), dtype=np.int64)


def copied_spans(
    tokenizer, answers: Sequence[Sequence[int]], passages: Sequence[Sequence[Mapping[str, str]] | None]
) -> list[list[tuple[int, str, int, int]]]:
    """Where each answer's ids stand in its example's passages, as span-constrained decoding saw them: every
    occurrence of the ids in a passage's title or text tokenised as `PassageSpanConstraint.from_passages` tokenises
    it, starting and ending on word boundaries as the constraint lets a span start and end, as character offsets
    from the tokenizer's offset mapping (a fast tokenizer's).

    Args:
        answers: per example, the generated answer's ids (after the answer prefix, before `</s>`).
        passages: per example, the fields (`title`, `text`) of the passages read; None: closed book.
    Returns:
        per example, (passage index, "title" or "text", start, end) with `field[start:end]` the words the ids
        stand for, passage by passage, the title before the text, earlier before later; [] where there is none
        (an answer cut mid-word by the length limit, or one copied from the null document).
    """
    continuation = set(continuation_token_ids(tokenizer).tolist())
    found = []
    for ids, read in zip(answers, passages):
        span, spans = [int(i) for i in ids], []
        fields = [(n, key, p.get(key) or "") for n, p in enumerate(read or []) for key in ("title", "text")]
        fields = [f for f in fields if f[2].strip()]
        if span and fields:
            encoded = tokenizer([f[2] for f in fields], add_special_tokens=False, return_offsets_mapping=True)
            for (n, key, text), tokens, offsets in zip(fields, encoded["input_ids"], encoded["offset_mapping"]):
                for at in range(len(tokens) - len(span) + 1):
                    end = at + len(span)
                    if tokens[at:end] == span and (end == len(tokens) or tokens[end] not in continuation):
                        spans.append((n, key, offsets[at][0], _with_combining_marks(text, offsets[end - 1][1])))
        found.append(spans)
    return found


def _with_combining_marks(text: str, end: int) -> int:
    """`end` moved past the combining marks that follow it: a normaliser that strips accents maps "é" written as
    e + U+0301 to the e alone, and the accent belongs to the cited letter."""
    while end < len(text) and unicodedata.combining(text[end]):
        end += 1
    return end


class PassageSpanConstraint:
    """Allowed next tokens for each (example, beam): the answer prefix (e.g. `<extra_id_0>`), then a span
    of one passage's title or text that starts and ends on word boundaries, then `</s>`.

    Call it as `prefix_allowed_tokens_fn(batch_id, sequence)` with `sequence` (T,) the decoder ids so far,
    starting with the decoder start token. An example with no passage (closed book) is unconstrained after
    the answer prefix.
    """

    def __init__(
        self,
        passage_token_ids: Sequence[Sequence[Sequence[int]]],
        *,
        answer_prefix: Sequence[int],
        eos_token_id: int,
        pad_token_id: int,
        continuation_ids: np.ndarray,
        vocab_size: int,
    ):
        """
        Args:
            passage_token_ids: per example, the token id sequences (title, text, … of each passage read)
                a span may come from.
            answer_prefix: ids the target has before the answer (forced first).
            continuation_ids: ids of word-continuing pieces (`continuation_token_ids`).
            vocab_size: the decoder's output size (what an unconstrained example may emit).
        """
        self.answer_prefix = [int(i) for i in answer_prefix]
        self.eos, self.pad, self.vocab_size = int(eos_token_id), int(pad_token_id), int(vocab_size)
        self._continuation = np.asarray(continuation_ids, dtype=np.int64)
        self._tokens: list[np.ndarray | None] = []
        self._starts: list[list[int]] = []
        for sequences in passage_token_ids:
            sequences = [list(s) for s in sequences if len(s)]
            if not sequences:
                self._tokens.append(None)
                self._starts.append([])
                continue
            tokens = np.array([int(t) for seq in sequences for t in [*seq, _SEPARATOR]], dtype=np.int64)
            self._tokens.append(tokens)
            real = tokens[tokens != _SEPARATOR]
            self._starts.append(sorted(set(real[~np.isin(real, self._continuation)].tolist())))
        # per example: span (tuple of ids) → positions in the joined tokens where an occurrence ends
        self._ends: list[dict[tuple[int, ...], np.ndarray]] = [{} for _ in self._tokens]

    @classmethod
    def from_passages(
        cls, tokenizer, passages: Sequence[Sequence[Mapping[str, str]] | None], *, answer_prefix: str, vocab_size: int
    ) -> PassageSpanConstraint:
        """Tokenise each example's passages (title and text separately, no special tokens) with the reader
        tokenizer: a word is tokenised as it is inside the reader input, so the spans match what it read."""
        per_example = []
        for read in passages:
            fields = [p.get(key) or "" for p in (read or []) for key in ("title", "text")]
            fields = [f for f in fields if f.strip()]
            per_example.append(tokenizer(fields, add_special_tokens=False)["input_ids"] if fields else [])
        prefix = tokenizer(answer_prefix, add_special_tokens=False)["input_ids"] if answer_prefix else []
        return cls(
            per_example,
            answer_prefix=prefix,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            continuation_ids=continuation_token_ids(tokenizer),
            vocab_size=vocab_size,
        )

    def __call__(self, batch_id: int, sequence: torch.Tensor) -> list[int]:
        """Allowed next ids after `sequence` (T,) for example `batch_id`."""
        generated = sequence[1:].tolist()  # [0] is the decoder start token
        if self.eos in generated:  # a finished greedy row is padded
            return [self.pad, self.eos]
        n_prefix = len(self.answer_prefix)
        if len(generated) < n_prefix:
            return [self.answer_prefix[len(generated)]]
        tokens = self._tokens[batch_id]
        if tokens is None:
            return list(range(self.vocab_size))
        span = tuple(generated[n_prefix:])
        if not span:
            return self._starts[batch_id]
        ends = self._span_ends(batch_id, span)
        following = tokens[ends + 1]
        allowed = set(following[following != _SEPARATOR].tolist())
        if len(ends) == 0 or not np.isin(following, self._continuation).all():
            allowed.add(self.eos)  # some occurrence ends on a word boundary (or none is left: stop)
        return sorted(allowed)

    def _span_ends(self, batch_id: int, span: tuple[int, ...]) -> np.ndarray:
        """Positions (in the joined tokens) where an occurrence of `span` ends, memoised along the prefix."""
        memo = self._ends[batch_id]
        if span in memo:
            return memo[span]
        tokens = self._tokens[batch_id]
        if len(span) == 1:
            ends = np.flatnonzero(tokens == span[0])
        else:
            previous = self._span_ends(batch_id, span[:-1])  # never the last position: that is a separator
            ends = previous[tokens[previous + 1] == span[-1]] + 1
        memo[span] = ends
        return ends


class StepPrefixConstraint(LogitsProcessor):
    """A `prefix_allowed_tokens_fn` applied to a whole decoding step at once: the ids so far cross to the host
    in one copy and the allowed (row, id) pairs come back in one. Hugging Face's
    `PrefixConstrainedLogitsProcessor` hands the function each row of the device tensor (on a GPU, a wait for
    the device per beam per step, as the function reads it) and writes each row's mask with its own indexing
    kernel: the host, not the GPU, set the pace of constrained decoding. The scores are the same, bit for bit,
    the unsatisfiable-row rule included."""

    def __init__(self, prefix_allowed_tokens_fn: Callable[[int, torch.Tensor], Sequence[int]], num_beams: int):
        self.allowed_fn, self.num_beams = prefix_allowed_tokens_fn, num_beams

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """input_ids (B·beams, T) the ids so far; scores (B·beams, V) → scores, -inf where not allowed."""
        rows, tokens = [], []
        for row, sequence in enumerate(input_ids.cpu()):  # the step's one device → host copy
            allowed = self.allowed_fn(row // self.num_beams, sequence)
            if len(allowed) == 0:
                raise ValueError(f"prefix_allowed_tokens_fn allowed no token for example {row // self.num_beams}")
            tokens.append(np.asarray(allowed, dtype=np.int64))
            rows.append(np.full(len(allowed), row, dtype=np.int64))
        index = torch.from_numpy(np.stack([np.concatenate(rows), np.concatenate(tokens)])).to(scores.device)
        mask = torch.full_like(scores, -math.inf)
        mask[index[0], index[1]] = 0
        processed = scores + mask
        # as transformers does: an example whose every beam has only -inf left takes the mask itself
        stuck = processed.amax(dim=-1).isneginf().view(-1, self.num_beams).all(dim=-1, keepdim=True)
        return torch.where(stuck.repeat_interleave(self.num_beams, dim=0), mask, processed)


class DeviceSpanConstraint(LogitsProcessor):
    """`PassageSpanConstraint` computed on the scores' device, with no copy to the host: each step matches the
    span generated so far against every position of its example's passages at once (a few tensor operations
    per step, whatever the batch and beams), so that constrained decoding on a GPU never waits for the host.
    The allowed tokens, and so the scores, are those of `StepPrefixConstraint(PassageSpanConstraint(…))`.

    Stateless: each step reads only the ids so far, so beam search may reorder its rows freely.
    """

    def __init__(self, constraint: PassageSpanConstraint, num_beams: int, device: torch.device | str):
        self.num_beams, self.eos, self.pad = num_beams, constraint.eos, constraint.pad
        self.answer_prefix = constraint.answer_prefix
        examples = constraint._tokens
        width = max((len(t) for t in examples if t is not None), default=0)
        tokens = np.full((len(examples), width), _SEPARATOR, dtype=np.int64)
        for i, joined in enumerate(examples):
            if joined is not None:
                tokens[i, : len(joined)] = joined
        vocab = constraint.vocab_size
        starts = np.zeros((len(examples), vocab), dtype=bool)
        for i, ids in enumerate(constraint._starts):
            starts[i, ids] = True
        continuation = np.zeros(vocab + 1, dtype=bool)  # the last entry stands for the separator: no continuation
        continuation[constraint._continuation] = True
        self.tokens = torch.from_numpy(tokens).to(device)  # (B, P) joined passage ids, -1 between and after them
        self.open = torch.tensor([t is None for t in examples], device=device)  # (B,) no passage: unconstrained
        self.starts = torch.from_numpy(starts).to(device)  # (B, V) the ids a span may start with
        self.continuation = torch.from_numpy(continuation).to(device)  # (V + 1,)

    def allowed(self, input_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """input_ids (B·beams, T) the ids so far, the decoder start token first → (B·beams, V) bool allowed."""
        rows, generated = input_ids.shape[0], input_ids[:, 1:]
        example = torch.arange(rows, device=input_ids.device) // self.num_beams
        n_prefix, length = len(self.answer_prefix), generated.shape[1]
        allowed = torch.zeros(rows, vocab_size, dtype=torch.bool, device=input_ids.device)
        vocab = min(vocab_size, self.starts.shape[1])
        if length < n_prefix:
            allowed[:, self.answer_prefix[length]] = True
        elif length == n_prefix:
            allowed[:, :vocab] = self.starts[example, :vocab]
        else:
            allowed[:, :vocab] = self._after_span(generated[:, n_prefix:], self.tokens[example])[:, :vocab]
        allowed |= self.open[example, None] & (length >= n_prefix)
        finished = (generated == self.eos).any(dim=1)  # a finished greedy row is padded
        allowed[finished] = False
        allowed[finished, self.pad] = True
        allowed[finished, self.eos] = True
        return allowed

    def _after_span(self, span: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """span (R, s), tokens (R, P) each row's example's passages → (R, V) the ids that may follow the span:
        what follows each of its occurrences, and `</s>` where one ends a word (or none is left)."""
        rows, width = tokens.shape
        length = span.shape[1]
        padded = torch.nn.functional.pad(tokens, (0, length + 1), value=_SEPARATOR)
        ends = torch.ones(rows, width, dtype=torch.bool, device=tokens.device)  # occurrence starting at p
        for j in range(length):
            ends &= padded[:, j : j + width] == span[:, j : j + 1]
        following = padded[:, length : length + width]  # (R, P) the id after the occurrence starting at p
        vocab = self.starts.shape[1]
        allowed = torch.zeros(rows, vocab + 1, dtype=torch.bool, device=tokens.device)
        slot = torch.where(ends, following, _SEPARATOR)
        allowed.scatter_(1, torch.where(slot < 0, vocab, slot), True)  # column V collects the separators
        word_end = (ends & ~self.continuation[torch.where(following < 0, vocab, following)]).any(dim=1)
        allowed[:, self.eos] |= word_end | ~ends.any(dim=1)
        return allowed[:, :vocab]

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        """input_ids (B·beams, T); scores (B·beams, V) → scores, -inf where not allowed (as `StepPrefixConstraint`)."""
        blocked = ~self.allowed(input_ids, scores.shape[1])
        processed = scores.masked_fill(blocked, -math.inf)
        stuck = processed.amax(dim=-1).isneginf().view(-1, self.num_beams).all(dim=-1, keepdim=True)
        if scores.device.type == "cpu" and not stuck.any():  # the usual case, seen without a wait on the host
            return processed
        mask = torch.zeros_like(scores).masked_fill_(blocked, -math.inf)
        return torch.where(stuck.repeat_interleave(self.num_beams, dim=0), mask, processed)
