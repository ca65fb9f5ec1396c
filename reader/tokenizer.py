"""The reader's tokenizer: T5 conventions (sentinels, `</s>` appended, `<pad>` = 0).

No T5 SentencePiece model is available offline, so the default reader tokenizer is built
from the WordPiece vocabulary of the shipped all-MiniLM-L6-v2 retriever, rearranged to
T5's layout: `<pad>` = 0 (T5 also uses it as the decoder start token), `</s>` = 1,
`<unk>` = 2, then the WordPiece pieces, then the sentinels `<extra_id_0>`…`<extra_id_99>`
as special tokens. Every encoded sequence ends in `</s>` and carries no [CLS]/[SEP], as
T5's tokenizer does. Any Hugging Face tokenizer folder that has the sentinels and an eos
token (a real T5 SentencePiece one, for instance) is accepted as well.

`reference_t5_tokenizer` makes a T5 SentencePiece tokenizer split text as transformers 4 did,
which facebookresearch/atlas ran (and so trained its readers on): transformers 5 drops the
separate `▁` that 4 kept before a special token (`… answer: <extra_id_0>`). The importer saves
readers' tokenizers that way; the saved folder keeps it (`tokenizer.json` holds the pipeline).

`train_t5_tokenizer` trains a T5 tokenizer here (no T5 SentencePiece model can be downloaded): a unigram model of
T5's size and settings over the text it is given, for the random-weight stand-ins of `reader.t5_architectures`.
"""

from __future__ import annotations

import io
import json
import string
from collections.abc import Iterable
from pathlib import Path

import sentencepiece
from tokenizers import Tokenizer, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import WordPiece
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast, T5Tokenizer

from common.modeling import MINILM, encoder_source, is_hub_id, missing_folder
from reader.fid import READER_PRESETS, WARM_START_PRESETS
from reader.reader_config import ReaderConfig

N_SENTINELS = 100
# the pieces of T5's SentencePiece model (the sentinels come after them: 32,100 tokens for a 32,128-row vocabulary)
T5_PIECES = 32_000
PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
# BERT's own special tokens have no role in a T5 reader; they are dropped from the vocabulary.
_BERT_SPECIALS = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}


def sentinel(index: int) -> str:
    """The T5 sentinel token number `index` (`<extra_id_{index}>`)."""
    return f"<extra_id_{index}>"


def wordpiece_t5_tokenizer(vocab_file: str | Path, lowercase: bool = True) -> PreTrainedTokenizerFast:
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
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        extra_special_tokens=[sentinel(i) for i in range(N_SENTINELS)],
        model_max_length=100_000,
        padding_side="right",
    )


def reference_t5_tokenizer(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerFast:
    """`tokenizer` (a T5 SentencePiece tokenizer: a Unigram model) splitting text as transformers 4.

    transformers 4's fast T5 tokenizer (facebookresearch/atlas pins 4.18) normalised each stretch
    of text between special tokens with the SentencePiece character map followed by
    `Replace(" {2,}", " ")`, then `Metaspace` turned every space into `▁`, put one in front, and
    split before each `▁`: a stretch ending in a space — `question: … answer: ` before
    `<extra_id_0>` — ends in a token `▁` of its own. transformers 5's T5 tokenizer splits on
    whitespace first, so that `▁` is gone, and it rebuilds that pipeline whenever it loads a T5
    tokenizer, whatever its `tokenizer.json` says. The result here is a plain
    `PreTrainedTokenizerFast` with the same vocabulary, special tokens and post-processor (`</s>`
    appended) and the transformers-4 normaliser and pre-tokenizer; saved, its folder loads back as
    such. Raises ValueError for a tokenizer that is not a SentencePiece (Unigram) one.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    spec = json.loads(backend.to_str()) if backend is not None else None
    if spec is None or spec.get("model", {}).get("type") != "Unigram":
        kind = spec.get("model", {}).get("type") if spec else type(tokenizer).__name__
        raise ValueError(f"not a T5 SentencePiece (Unigram) tokenizer ({kind}): the reference's T5 tokenizers are")

    def charsmaps(normalizer: dict | None) -> list[dict]:
        if not normalizer:
            return []
        if normalizer.get("type") == "Precompiled":
            return [normalizer]
        return [m for child in normalizer.get("normalizers", []) for m in charsmaps(child)]

    spec["normalizer"] = {
        "type": "Sequence",
        "normalizers": [
            *charsmaps(spec.get("normalizer")),
            {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "},
        ],
    }
    spec["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": True}
    sentinels = sorted(
        (t for t in tokenizer.get_vocab() if t.startswith("<extra_id_") and t.endswith(">")),
        key=lambda t: int(t[len("<extra_id_") : -1]) if t[len("<extra_id_") : -1].isdigit() else -1,
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        eos_token=tokenizer.eos_token,
        pad_token=tokenizer.pad_token,
        unk_token=tokenizer.unk_token,
        extra_special_tokens=sentinels,
        model_max_length=tokenizer.model_max_length,
        padding_side="right",
    )


def train_t5_tokenizer(texts: Iterable[str], folder: str | Path, *, pieces: int = T5_PIECES) -> T5Tokenizer:
    """A T5 tokenizer trained on `texts` (one paragraph each), saved in `folder` and loaded back from it.

    A SentencePiece unigram model of `pieces` pieces with T5's settings — `<pad>` 0, `</s>` 1, `<unk>` 2, no `<s>`;
    NFKC normalisation; a `▁` before each word; digits not split — then the sentinels `<extra_id_99>`…`<extra_id_0>`
    after the pieces, as T5's (`<extra_id_0>` the last id). Every printable ASCII character is a piece whatever
    its count in the text. `folder` gets `spiece.model` and the Hugging Face tokenizer files. Raises ValueError
    when the text cannot support that many pieces (SentencePiece says how many it can).
    """
    folder = Path(folder)
    model = io.BytesIO()
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=model,
            vocab_size=pieces,
            model_type="unigram",
            pad_id=0,
            eos_id=1,
            unk_id=2,
            bos_id=-1,
            normalization_rule_name="nmt_nfkc",
            required_chars="".join(c for c in string.printable if not c.isspace()),
            max_sentence_length=1 << 16,  # a paragraph is one "sentence": the 4,192-byte default drops long ones
            minloglevel=2,
        )
    except RuntimeError as e:
        raise ValueError(f"a {pieces}-piece SentencePiece model cannot be trained on this text: {e}") from None
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spiece.model").write_bytes(model.getvalue())
    tokenizer = T5Tokenizer.from_pretrained(str(folder), extra_ids=N_SENTINELS)
    tokenizer.save_pretrained(str(folder))
    check_reader_tokenizer(tokenizer, str(folder))
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
        return wordpiece_t5_tokenizer(Path(encoder_source(MINILM)) / "vocab.txt")
    folder = Path(path)
    if not folder.is_dir():
        name = str(path)
        if not is_hub_id(name):
            raise missing_folder(name, "reader folder")
        try:  # a hub name, for users with a network (or a cache)
            tokenizer = AutoTokenizer.from_pretrained(name)
        except OSError as e:
            raise FileNotFoundError(
                f"reader tokenizer {name!r}: not a local folder, nor found on the Hub ({e})"
            ) from None
        check_reader_tokenizer(tokenizer, name)
        return tokenizer
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    check_reader_tokenizer(tokenizer, str(folder))
    return tokenizer


def reader_tokenizer(config: ReaderConfig, folder: Path | None = None) -> PreTrainedTokenizerBase:
    """The tokenizer of the reader `config` describes: a saved reader's own (`folder`), else `config.tokenizer`,
    else for a preset the MiniLM WordPiece vocabulary with T5 sentinels, else the model folder's or hub name's."""
    if folder is not None:
        return build_reader_tokenizer(folder)
    if config.tokenizer:
        return build_reader_tokenizer(config.tokenizer)
    if config.model in READER_PRESETS or config.model in WARM_START_PRESETS:
        return build_reader_tokenizer(None)
    return build_reader_tokenizer(config.model)
