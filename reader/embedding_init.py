"""Start a reader's token embeddings from another model's, for the tokens both vocabularies have.

The default reader shares its WordPiece vocabulary with the MiniLM retriever, so a randomly
initialised reader can begin with MiniLM's pretrained token embeddings instead of noise: a
small reader trained on a CPU then spends its first steps on reading rather than on learning
what words are (measured: docs/results/reader.md).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase, T5ForConditionalGeneration


def project_embeddings(source: torch.Tensor, width: int) -> torch.Tensor:
    """Centre `source` (V, d) and express it in its top-`width` principal directions: → (V, width).

    Wider targets keep all d directions and pad with zeros. Deterministic (a full SVD)."""
    centred = source.double() - source.double().mean(0)
    _, _, directions = torch.linalg.svd(centred, full_matrices=False)  # (d, d), rows by variance
    projected = centred @ directions[: min(width, directions.shape[0])].T  # (V, min(width, d))
    if projected.shape[1] < width:
        projected = torch.nn.functional.pad(projected, (0, width - projected.shape[1]))
    return projected


def transfer_token_embeddings(
    t5: T5ForConditionalGeneration,
    tokenizer: PreTrainedTokenizerBase,
    source: torch.Tensor,
    source_vocab: dict[str, int],
) -> int:
    """Overwrite the rows of `t5.shared` (V_r, d_model) whose token string is in `source_vocab`
    with that token's row of `source` (V_s, d_s), projected to d_model (`project_embeddings`)
    and rescaled to the standard deviation of the reader's current embeddings. Tokens only the
    reader has (its sentinels, `</s>`, …) keep their initialisation. → the number of rows set.
    """
    shared = t5.shared.weight
    projected = project_embeddings(source.detach().cpu(), shared.shape[1])
    reader_rows, source_rows = [], []
    for token, row in tokenizer.get_vocab().items():
        if token in source_vocab and row < shared.shape[0]:
            reader_rows.append(row)
            source_rows.append(source_vocab[token])
    if not reader_rows:
        raise ValueError("the reader's and the source's vocabularies share no token")
    picked = projected[torch.tensor(source_rows)]  # (n, d_model)
    picked = picked * (shared.detach().double().std() / picked.std())
    with torch.no_grad():
        shared[torch.tensor(reader_rows)] = picked.to(shared.dtype).to(shared.device)
    return len(reader_rows)
