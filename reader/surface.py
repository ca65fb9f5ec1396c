"""The surface form of a copied answer: its characters as the passage writes them.

A WordPiece reader tokenizer (the shipped reader's, from MiniLM) lower-cases, strips accents and
splits punctuation into tokens of their own, so decoding the copied tokens of "3.2 million",
"rear-view" or "Pelé" gives "3. 2 million", "rear - view", "pele". The official QA normalisation
deletes punctuation without closing the gap ("3 2 million" ≠ "32 million"), so such answers are
wrong by exact match although the reader copied the right span. Where the generated text, compared
without case, accents and whitespace, occurs in a passage the reader read, that passage's own
characters are returned instead; an answer that is not in any passage (abstractive) is kept as
generated. Text between special tokens (sentinels, `</s>`) is restored piece by piece, the special
tokens are kept, so tasks parse the result as before.

A model imported from a reference implementation decodes its answers as that reference did instead
(`reference_decode`, `inference.reference_decoding`): with every special token dropped and transformers 4's
clean-up of spaces before punctuation.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence


def _fold_char(char: str) -> str:
    """One character as the comparison sees it: lower case, no accents, no whitespace ('' if none)."""
    if char.isspace():
        return ""
    return "".join(c for c in unicodedata.normalize("NFKD", char.lower()) if not unicodedata.combining(c))


def fold(text: str) -> str:
    """`text` without case, accents and whitespace (the key an answer is looked up by)."""
    return "".join(_fold_char(c) for c in text)


def find_surface(answer: str, texts: Iterable[str]) -> str | None:
    """The first span of `texts` that folds to `fold(answer)`, in its original characters, or None."""
    key = fold(answer)
    if not key:
        return None
    for text in texts:
        if key not in fold(text):
            continue
        folded, origin = [], []  # folded characters and the index in `text` each came from
        for position, char in enumerate(text):
            for piece in _fold_char(char):
                folded.append(piece)
                origin.append(position)
        start = "".join(folded).find(key)
        return text[origin[start] : origin[start + len(key) - 1] + 1]
    return None


def restore_surface(
    generated: str, passages: Sequence[Mapping[str, str]] | None, special_tokens: Sequence[str] = ()
) -> str:
    """`generated` with each stretch of text between `special_tokens` replaced by its surface form
    in `passages` (dicts with "text" and optionally "title") where it occurs there.

    Leading/trailing spaces of a stretch are kept, so "<extra_id_0> 3. 2 million</s>" becomes
    "<extra_id_0> 3.2 million</s>".
    """
    if not passages:
        return generated
    texts = [t for p in passages for t in (p.get("text") or "", p.get("title") or "") if t]
    specials = sorted({s for s in special_tokens if s}, key=len, reverse=True)
    pieces = re.split(f"({'|'.join(map(re.escape, specials))})", generated) if specials else [generated]
    restored = []
    for piece in pieces:
        core = piece.strip()
        surface = None if not core or piece in specials else find_surface(core, texts)
        if surface is None:
            restored.append(piece)
        else:
            lead = piece[: len(piece) - len(piece.lstrip())]
            trail = piece[len(piece.rstrip()) :]
            restored.append(f"{lead}{surface}{trail}")
    return "".join(restored)


# Text a lossless tokenizer decodes back to itself: punctuation inside words and numbers (a WordPiece tokenizer
# splits it off with spaces, which is what `restore_surface` exists for); plain lower-case ASCII, so that
# a small SentencePiece vocabulary holds every character of it.
_ROUND_TRIP = "rear-view 3.2 crown's"


def decoding_is_lossless(tokenizer) -> bool:
    """Whether `tokenizer` decodes its own encoding of ordinary text back to the same characters (T5's
    SentencePiece does; a lower-casing WordPiece does not). Only a lossy one's answers need their surface
    form restored from the passages: restoring a lossless one's would put back spaces the reader did not
    write (a generated "talat crown" found in the passage as "tal at crown")."""
    ids = tokenizer(_ROUND_TRIP, add_special_tokens=False)["input_ids"]
    return tokenizer.decode(ids, skip_special_tokens=True).strip() == _ROUND_TRIP


# transformers' `clean_up_tokenization` before version 5, which their `decode` applied by default
# (`clean_up_tokenization_spaces=True`): spaces before punctuation and English contractions closed up
_CLEAN_UP = (
    (" .", "."),
    (" ?", "?"),
    (" !", "!"),
    (" ,", ","),
    (" ' ", "'"),
    (" n't", "n't"),
    (" 'm", "'m"),
    (" 's", "'s"),
    (" 've", "'ve"),
    (" 're", "'re"),
)


def clean_up_tokenization(text: str) -> str:
    """`text` cleaned up as transformers 3 and 4 cleaned up decoded text by default (" ." → ".", " n't" → "n't")."""
    for old, new in _CLEAN_UP:
        text = text.replace(old, new)
    return text


def reference_decode(tokenizer, ids: Sequence[int]) -> str:
    """Generated `ids` as text, as facebookresearch/atlas (transformers 4.18) and FiD (3.0.2) decoded their answers:
    `tokenizer.decode(ids, skip_special_tokens=True)`. Every special token (`<pad>`, `</s>`, `<unk>`, the
    sentinels) is dropped before the other pieces are decoded, so the pieces either side of one join
    ("▁tal", "<extra_id_1>", "at" → "talat"; kept and read as a space, they made "tal at"), then the default
    clean-up of those versions (`clean_up_tokenization`) is applied. A T5 SentencePiece tokenizer's decoder
    (Metaspace) gives SentencePiece's own decode of the pieces; spaces at the ends are left as transformers 4's
    fast tokenizer (`AutoTokenizer`) left them."""
    special = set(tokenizer.all_special_ids)
    kept = [int(i) for i in ids if int(i) not in special]
    text = tokenizer.decode(kept, skip_special_tokens=True, clean_up_tokenization_spaces=False)
    return clean_up_tokenization(text)


def decode_answers(
    tokenizer,
    generated,
    passages: Sequence[Sequence[Mapping[str, str]] | None] | None,
    *,
    skip_special_tokens: bool = True,
    as_reference: bool = False,
) -> list[str]:
    """Decode generated ids (B, T') and give each answer its surface form in the passages its
    example read (`passages[b]`; None or empty: closed book, kept as decoded). `as_reference`: decode
    as the reference implementations did (`reference_decode`: no special token is left in the text)."""
    if as_reference:
        rows = generated.tolist() if hasattr(generated, "tolist") else generated
        texts = [reference_decode(tokenizer, row) for row in rows]
        specials = ()
    else:
        texts = tokenizer.batch_decode(generated, skip_special_tokens=skip_special_tokens)
        specials = () if skip_special_tokens else tokenizer.all_special_tokens
    if passages is None:
        return texts
    return [restore_surface(text, read, specials) for text, read in zip(texts, passages)]
