"""Retriever losses: the retriever is trained through the reader (SPEC "The model, exactly").

Each loss has two halves:
  * `gold_scores`: what the reader thinks of each passage, computed under `torch.no_grad()`
    with the reader in eval mode (its mode is restored afterwards), so the retriever loss
    never sends gradient into the reader;
  * `loss`: the retriever-side objective from the raw retriever scores s (B, K) (inner
    products; scaled here to s' = s / sqrt(dim)) and the gold scores.

For `adist`, `pdist` and `loop`: KL(p_gold ‖ p_retr), p_gold = softmax(gold / τ_gold),
p_retr = softmax(s' / τ_score), summed over passages and averaged over the batch.
`emdr` maximises log Σ_k p_retr(d_k | q) · p_reader(a | q, d_k)^(1/τ_gold).

With REALM's null document (`retriever.null_document`; retriever/null_document.py), one of the K candidates
is an empty passage ∅: its raw score s(q, ∅) = E_q(q) · E_p(∅) is a column of `scores` like any other and its
gold score is the reader's on the empty passage, so it sits in the same softmaxes (p_retr, p_gold, EMDR²'s
mixture) and nothing here treats it apart. EMDR²'s gradient on a score s(q, z) is REALM's
−r(z) / (sqrt(dim) · τ_score), r(z) = [p(a | q, z) / p(a | q) − 1] · p(z | q) (at τ_gold = 1): with ∅ in the
mixture p(a | q), a passage is lifted only where it explains the answer better than a mixture that can put
its weight on reading nothing.

Each loss declares its own options with their defaults (`default_options`, e.g. `emdr`'s
`granularity`), set in a recipe as `retriever.loss: {name: emdr, granularity: token}`;
`atlas.config` checks a recipe's options against them, as it checks task options.

This module depends on the reader only through the `GoldReader` protocol (the methods of
`reader.fid.FiDReader`), keeping `retriever/` independent of `reader/`.

Shapes: B examples, K passages, L tokens per passage, H reader width, T target tokens.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Protocol

import torch
import torch.nn.functional as F

from common.modeling import IGNORE_INDEX, eval_mode

# How the gold pass encodes passages (`reader.encoder_precision.PRECISIONS`, not imported: retriever/ stays
# independent of reader/)
GOLD_PRECISIONS = ("auto", "fp32", "bf16")


class GoldReader(Protocol):
    """What the gold computations need from the reader (implemented by `FiDReader`)."""

    training: bool

    def train(self, mode: bool = True): ...
    def encode(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, precision: str = "fp32"
    ) -> torch.Tensor: ...
    def per_passage_token_logprobs(
        self,
        encoder_states: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        temperature: float = 1.0,
        input_ids: torch.Tensor | None = None,
    ) -> torch.Tensor: ...
    def leave_one_out_nll(
        self,
        encoder_states: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        input_ids: torch.Tensor | None = None,
    ) -> torch.Tensor: ...
    def cross_attention_scores(
        self,
        encoder_states: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        input_ids: torch.Tensor | None = None,
    ) -> torch.Tensor: ...
    def copy_attention_scores(
        self,
        encoder_states: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        input_ids: torch.Tensor | None = None,
    ) -> torch.Tensor: ...
    @property
    def copies_from_source(self) -> bool: ...


def masked_log_softmax(logits: torch.Tensor, present: torch.Tensor | None) -> torch.Tensor:
    """log softmax over passages (last axis); absent passages (present False) get -inf.

    A row with no present passage at all is left unmasked (finite values) so that nothing
    downstream turns into nan; callers drop such rows with `example_mean`.
    """
    if present is not None:
        empty = ~present.any(-1, keepdim=True)  # (B, 1)
        logits = logits.masked_fill(~(present | empty), float("-inf"))
    return F.log_softmax(logits, dim=-1)


def example_mean(per_example: torch.Tensor, present: torch.Tensor | None) -> torch.Tensor:
    """Mean of a per-example loss (B,) over the examples with at least one present passage.

    With `present` None every example counts. When no example has a passage the result is
    a zero that still belongs to the graph (so `backward()` works and sends zero gradient).
    """
    if present is None:
        return per_example.mean()
    has_passage = present.any(-1)  # (B,)
    total = torch.where(has_passage, per_example, torch.zeros_like(per_example)).sum()
    return total / has_passage.sum().clamp(min=1)


def scaled_log_probs(
    scores: torch.Tensor, dim: int, temperature: float, present: torch.Tensor | None = None
) -> torch.Tensor:
    """log softmax(s / sqrt(dim) / temperature) over passages: (B, K) → (B, K)."""
    return masked_log_softmax(scores.float() / math.sqrt(dim) / temperature, present)


def kl_distillation(
    scores: torch.Tensor,
    gold: torch.Tensor,
    *,
    dim: int,
    temperature_gold: float,
    temperature_score: float,
    present: torch.Tensor | None = None,
) -> torch.Tensor:
    """KL(p_gold ‖ p_retr) summed over passages, averaged over the batch.

    Args:
        scores: (B, K) raw retriever inner products (with gradient).
        gold: (B, K) gold scores (no gradient).
        dim: retriever embedding dimension (for the 1/sqrt(dim) scaling).
        present: (B, K) bool, False for padding passages: they get zero probability in both
            distributions (which are renormalised over the present ones); an example with no
            present passage is left out of the batch mean.
    Returns:
        scalar loss.
    """
    log_p_gold = masked_log_softmax(gold.float() / temperature_gold, present)
    log_p_retr = scaled_log_probs(scores, dim, temperature_score, present)
    terms = log_p_gold.exp() * (log_p_gold - log_p_retr)
    if present is not None:  # absent passages: 0 · (-inf - -inf) would be nan
        terms = torch.where(present, terms, torch.zeros_like(terms))
    return example_mean(terms.sum(-1), present)


class RetrieverLoss(ABC):
    """A retriever loss: gold scores from the reader, then the loss on retriever scores."""

    name: ClassVar[str]
    trains_retriever: ClassVar[bool] = True
    # This loss's own options (keyword arguments of __init__) and their defaults; a recipe sets them beside
    # the name (`retriever.loss: {name: emdr, granularity: token}`). A value must have the default's type
    # and, where `option_choices` lists them, be one of the choices.
    default_options: ClassVar[dict[str, Any]] = {}
    option_choices: ClassVar[dict[str, tuple[Any, ...]]] = {}

    def __init__(
        self,
        *,
        temperature_gold: float = 0.01,
        temperature_score: float = 0.01,
        gold_precision: str = "fp32",
        **options: Any,
    ) -> None:
        """gold_precision: how the gold pass encodes passages when it is not given eval-mode encoder
        states: "fp32" (the reader's own precision), "bf16" (bfloat16 autocast) or "auto" (bf16 where
        the hardware multiplies it natively); see `reader.encoder_precision`. `options`: this loss's own
        (`default_options`; its defaults where not given), each set as an attribute; ValueError naming an
        unknown one, or a value not among `option_choices`."""
        if gold_precision not in GOLD_PRECISIONS:
            raise ValueError(f"unknown gold precision {gold_precision!r}; valid: {list(GOLD_PRECISIONS)}")
        self.gold_precision = gold_precision
        if temperature_gold <= 0 or temperature_score <= 0:
            raise ValueError(f"temperatures must be positive, got gold={temperature_gold}, score={temperature_score}")
        self.temperature_gold = temperature_gold
        self.temperature_score = temperature_score
        unknown = sorted(set(options) - set(self.default_options))
        if unknown:
            raise ValueError(
                f"unknown option {unknown[0]!r} of retriever loss {self.name!r}; "
                f"valid: {sorted(self.default_options) or '(none)'}"
            )
        for key, value in {**self.default_options, **options}.items():
            choices = self.option_choices.get(key)
            if choices is not None and value not in choices:
                raise ValueError(f"unknown {self.name} {key} {value!r}; valid: {list(choices)}")
            setattr(self, key, value)

    def gold_scores(
        self,
        reader: GoldReader,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        encoder_states: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The reader's gold scores, under no-grad with the reader in eval mode.

        Args:
            input_ids: (B, K, L) reader inputs for all K passages the loss covers.
            attention_mask: (B, K, L).
            labels: (B, T), -100 at ignored positions.
            encoder_states: (B, K, L, H) eval-mode encoder states to reuse (for example the
                training pass's states when the reader has no dropout); encoded here if None.
        Returns:
            gold scores: (B, K), or (B, K, T) for token-level EMDR².
        """
        with eval_mode(reader), torch.no_grad():
            if encoder_states is None:
                encoder_states = reader.encode(input_ids, attention_mask, precision=self.gold_precision)
            return self._gold(reader, encoder_states.detach(), attention_mask, labels, input_ids)

    @abstractmethod
    def _gold(
        self,
        reader: GoldReader,
        encoder_states: torch.Tensor,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        input_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Gold scores from eval-mode encoder states (B, K, L, H); `input_ids` (B, K, L) for a
        reader that copies from its input."""

    def loss(
        self,
        scores: torch.Tensor,
        gold: torch.Tensor,
        labels: torch.Tensor,
        *,
        dim: int,
        present: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The loss from retriever scores (B, K) and gold scores; default: KL distillation.

        `present` (B, K) bool marks real passages; padding passages are left out.
        """
        return kl_distillation(
            scores,
            gold,
            dim=dim,
            temperature_gold=self.temperature_gold,
            temperature_score=self.temperature_score,
            present=present,
        )

    def __call__(
        self,
        reader: GoldReader,
        scores: torch.Tensor,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor,
        labels: torch.Tensor,
        *,
        dim: int,
        encoder_states: torch.Tensor | None = None,
        present: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """Gold scores then loss; scores: (B, K) raw inner products. Returns a scalar.

        present: (B, K) bool, the real passages. Default: the rows whose attention mask is not
        all zero (`reader.inputs` pads ragged passage lists with fully masked rows). Give it
        explicitly where a real reader row is not a passage (a query read alone because the
        example has no passage). Absent passages get zero probability on both sides.
        """
        gold = self.gold_scores(reader, input_ids, attention_mask, labels, encoder_states)
        if present is None:
            present = attention_mask.bool().any(-1)  # (B, K)
        elif present.shape != scores.shape:
            raise ValueError(f"present mask {tuple(present.shape)} does not match scores {tuple(scores.shape)}")
        return self.loss(scores, gold, labels, dim=dim, present=present.to(scores.device))


class AttentionDistillation(RetrieverLoss):
    """`adist`: gold = the attention mass the reader puts on each passage while producing the target.

    attention "cross": cross-attention probability × value norm, over decoder layers (the paper's);
    "copy": the copy head's pointer probability (a reader with a copy head); "auto" (the default): copy
    where the reader has a copy head, else cross, because a copying reader takes its answer from where its
    pointer looks, so the pointer ranks passages by use (bench/gold_signal.py compares the two,
    docs/results/retriever.md).
    """

    name = "adist"
    default_options: ClassVar[dict[str, Any]] = {"attention": "auto"}
    option_choices: ClassVar[dict[str, tuple[Any, ...]]] = {"attention": ("auto", "cross", "copy")}
    attention: str

    def _gold(self, reader, encoder_states, attention_mask, labels, input_ids=None):
        copy = self.attention == "copy" or (self.attention == "auto" and reader.copies_from_source)
        scores = reader.copy_attention_scores if copy else reader.cross_attention_scores
        return scores(encoder_states, attention_mask, labels, input_ids=input_ids)


class PerplexityDistillation(RetrieverLoss):
    """`pdist`: gold = mean token log-likelihood of the target reading passage k alone."""

    name = "pdist"

    def _gold(self, reader, encoder_states, attention_mask, labels, input_ids=None):
        token_logprobs = reader.per_passage_token_logprobs(encoder_states, attention_mask, labels, input_ids=input_ids)
        n_tokens = (labels != IGNORE_INDEX).sum(-1).clamp(min=1)  # (B,)
        return token_logprobs.sum(-1) / n_tokens.unsqueeze(-1)


class LeaveOneOut(RetrieverLoss):
    """`loop`: gold = mean token NLL of the target reading every passage but k."""

    name = "loop"

    def _gold(self, reader, encoder_states, attention_mask, labels, input_ids=None):
        return reader.leave_one_out_nll(encoder_states, attention_mask, labels, input_ids=input_ids)


class EMDR(RetrieverLoss):
    """`emdr`: −log Σ_k p_retr(d_k | q) · p_reader(a | q, d_k)^(1/τ_gold), batch mean.

    granularity "sequence" (default): p_reader(a | q, d_k) = Π_t p(a_t | …), gold (B, K) is
    Σ_t log p(a_t | …). granularity "token" (the reference implementation's): the mixture
    is taken per target token with the reader's logits divided by τ_gold inside the softmax,
    −Σ_{b,t} log Σ_k p_retr(k) · softmax(z_{k,t} / τ_gold)[a_t] / (number of target tokens);
    gold (B, K, T).
    """

    name = "emdr"
    default_options: ClassVar[dict[str, Any]] = {"granularity": "sequence"}
    option_choices: ClassVar[dict[str, tuple[Any, ...]]] = {"granularity": ("sequence", "token")}
    granularity: str

    def _gold(self, reader, encoder_states, attention_mask, labels, input_ids=None):
        token = self.granularity == "token"  # the reader's logits divided by τ_gold inside the softmax
        temperature = self.temperature_gold if token else 1.0
        logprobs = reader.per_passage_token_logprobs(
            encoder_states, attention_mask, labels, temperature=temperature, input_ids=input_ids
        )  # (B, K, T)
        return logprobs if token else logprobs.sum(-1)

    def loss(self, scores, gold, labels, *, dim, present=None):
        # Absent passages get log p_retr = -inf, so they drop out of the mixtures.
        log_p_retr = scaled_log_probs(scores, dim, self.temperature_score, present)  # (B, K)
        if self.granularity == "token":
            mixed = torch.logsumexp(log_p_retr.unsqueeze(-1) + gold.float(), dim=1)  # (B, T)
            valid = labels != IGNORE_INDEX
            if present is not None:  # an example with no passage has no mixture
                valid = valid & present.any(-1, keepdim=True)
            return -torch.where(valid, mixed, torch.zeros_like(mixed)).sum() / valid.sum().clamp(min=1)
        mixed = torch.logsumexp(log_p_retr + gold.float() / self.temperature_gold, dim=-1)  # (B,)
        return example_mean(-mixed, present)


class NoRetrieverLoss(RetrieverLoss):
    """`none`: the retriever is frozen; no gold scores are computed and the loss is None."""

    name = "none"
    trains_retriever = False

    def _gold(self, reader, encoder_states, attention_mask, labels, input_ids=None):
        raise RuntimeError("the 'none' retriever loss computes no gold scores")

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


RETRIEVER_LOSSES: dict[str, type[RetrieverLoss]] = {
    cls.name: cls for cls in (AttentionDistillation, PerplexityDistillation, LeaveOneOut, EMDR, NoRetrieverLoss)
}


def build_retriever_loss(
    name: str,
    *,
    temperature_gold: float = 0.01,
    temperature_score: float = 0.01,
    gold_precision: str = "fp32",
    **options: Any,
) -> RetrieverLoss:
    """The retriever loss registered as `name` with its own `options` (its `default_options` where not
    given); ValueError listing the valid names, or that loss's valid options, otherwise."""
    if name not in RETRIEVER_LOSSES:
        raise ValueError(f"unknown retriever loss {name!r}; valid: {sorted(RETRIEVER_LOSSES)}")
    return RETRIEVER_LOSSES[name](
        temperature_gold=temperature_gold, temperature_score=temperature_score, gold_precision=gold_precision, **options
    )
