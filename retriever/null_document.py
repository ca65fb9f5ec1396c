"""REALM's null document: one empty passage among each query's retrieved candidates.

REALM (Guu et al., 2020, "Injecting inductive biases into pre-training") adds an empty document ∅ to the top-k
retrieved documents, so that a masked span (or a question) that needs no world knowledge can put its
probability on a consistent sink instead of on an unrelated passage, which would otherwise pull the retriever
toward noise. REALM scores every document z, ∅ included, by the same f(x, z) = Embed_input(x)ᵀ Embed_doc(z),
Embed_doc reading the document's (empty) title and body. Here likewise the null document is a passage with
empty title and text:
  * the retriever scores it as any passage, s(q, ∅) = E_q(q) · E_p(∅), E_p(∅) the passage encoder's
    embedding of the empty passage (one vector for every query; with a frozen passage encoder it is fixed,
    and the query encoder learns when to point at it), and its score joins the same softmax;
  * the reader reads it as it reads any passage, through `reader.passage_format` with the empty fields
    ("{query} title:  context: " by default, the reference implementation's empty passage).

`retriever.null_document` (atlas.config) says where it joins: "never", "train" (the passages read in training
and those the retriever loss covers) or "always" (also when answering). It is never shown as evidence: it is
added to the passages the reader reads after they are retrieved, never to what retrieval returns.
"""

from __future__ import annotations

from tasks.passage import Passage

# The null document's `id`: not one a corpus can hold, since a prepared corpus's ids come from its records and
# these angle brackets are in none of the formats atlas reads (still: `is_null_document` is how it is told apart).
NULL_DOCUMENT_ID = "<null document>"


def null_document() -> Passage:
    """A fresh null document: empty title and text, no score, no index row."""
    return Passage(id=NULL_DOCUMENT_ID)


def is_null_document(passage: Passage) -> bool:
    """Whether `passage` is the null document."""
    return passage.id == NULL_DOCUMENT_ID


def with_null_document(passages: list[list[Passage]]) -> list[list[Passage]]:
    """Each example's passages with the null document first: [[∅, d_1, …, d_k], …].

    First, so that the passages the retriever loss covers stay a prefix of those the reader reads (or the
    reverse) when the two counts differ, as they are without it; FiD reads its passages as a set, so the
    place changes nothing else.
    """
    return [[null_document(), *ps] for ps in passages]
