"""Reference checkpoints → this project's folders.

`import_atlas_checkpoint`: a facebookresearch/atlas `model.pth.tar` ({"opt": Namespace,
"step", "model": state dict, "optimizer", "scheduler", …}) → a run folder that `atlas
evaluate`, `atlas ask` and `atlas train` (from its config) accept:

    OUT/checkpoints/step-NNNNNN/reader/      HF T5 folder (safetensors) + the reader tokenizer
    OUT/checkpoints/step-NNNNNN/retriever/   query/ (+ passage/ when untied) + retriever.json
    OUT/checkpoints/step-NNNNNN/config.yaml  the reference options that matter, as our config
    OUT/checkpoints/step-NNNNNN/import.json  where it came from, what was and was not imported
    OUT/checkpoints/latest, OUT/config.yaml

The state dict's keys: `reader.` + T5 keys (Atlas's FiD is a plain T5 module), and
`retriever.contriever.` + BertModel keys (tied) or `retriever.query_contriever.` and
`retriever.passage_contriever.` (untied, query-side training); DDP/FSDP wrappers add
`.module` components, which are dropped wherever they occur.

`import_fid_reader`: a facebookresearch/FiD reader folder (FiDT5.save_pretrained: the T5
encoder wrapped, `encoder.encoder.block.{i}.module.…`) → a plain HF T5 reader folder.

What the reference computed and this project would otherwise compute differently is converted,
and each conversion is listed under `conversions` in import.json (docs/guides/coming-from-reference.md):
the retriever's layer norm (`retriever.encoder.ReferenceLayerNorm`), the reader tokenizer's
segmentation (`reader.tokenizer.reference_t5_tokenizer`), `generation_max_length` (the reference
counts the decoder start token), an own `lm_head` (`reader.t5_untied`) and a transformers-3
cross-attention bias (`reader.cross_attention_bias`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import yaml
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import AutoTokenizer, BertConfig, T5Config

from atlas.config import AtlasConfig, LossConfig, save_config, validate_components
from atlas.importing.safe_pickle import load_torch_file
from atlas.importing.weights import bert_from_state_dict, read_config_file, t5_from_state_dict
from atlas.loading import READER_SETTINGS_FILE
from common.io import InputError, atomic_directory, atomic_write_json, atomic_write_text
from reader.cross_attention_bias import CROSS_BIAS_KEY, has_cross_attention_bias
from reader.fid import FiDReader
from reader.t5_untied import UntiedT5ForConditionalGeneration
from reader.tokenizer import build_reader_tokenizer, reference_t5_tokenizer
from retriever.encoder import ContrieverEncoder
from retriever.retriever import Retriever

logger = logging.getLogger(__name__)

CHECKPOINT_FILE = "model.pth.tar"
# the reference's gold_score_mode → our retriever.loss (its README: pdist = ppmean, adist = evalnormsum)
GOLD_SCORE_MODES = {"ppmean": "pdist", "evalnormsum": "adist"} | {m: m for m in ("pdist", "adist", "emdr", "loop")}
# the reference's task names → ours (the same but for multiple_choice)
TASK_NAMES = {"multiple_choice": "mmlu"} | {name: name for name in ("qa", "kilt", "fever", "mlm", "lm", "section")}
# the reference's schedulers → ours (any other: linear)
SCHEDULERS = {"linear": "linear", "cosine": "cosine", "fixed": "constant"}
BERT_MAX_LENGTH = 512  # the reference truncates retriever inputs to min(text_maxlength, 512)
REFERENCE_MAX_LENGTH = 128  # the reference's default generation_max_length


def reference_new_tokens(max_length: Any) -> int:
    """Our `inference.generation_max_length` (tokens generated) for the reference's `generation_max_length`,
    which is transformers 4's `generate(max_length=…)`: the whole decoder sequence, start token included."""
    return max(int(max_length) - 1, 1)


def _strip_module(key: str) -> str:
    """`reader.module.shared.weight` → `reader.shared.weight`: DDP/FSDP/checkpoint wrappers' `module`."""
    return ".".join(part for part in key.split(".") if part != "module")


def find_checkpoint_file(src: str | Path) -> Path:
    """`model.pth.tar` from itself, a step folder holding it, or a reference run folder
    (`checkpoint/latest/`, the reference's layout)."""
    src = Path(src)
    for candidate in (src, src / CHECKPOINT_FILE, src / "checkpoint" / "latest" / CHECKPOINT_FILE):
        if candidate.is_file():
            return candidate
    raise InputError(
        src,
        None,
        None,
        f"no {CHECKPOINT_FILE} here (give the file, the step folder holding it, "
        "or the reference run folder with checkpoint/latest/)",
    )


def split_atlas_state(model_state: Mapping[str, Any], source: str) -> dict[str, dict[str, torch.Tensor]]:
    """Split an Atlas state dict into HF-layout parts: {"reader": T5 keys, and "retriever"
    (tied) or "query" and "passage" (untied): BertModel keys}. `.module` infixes are dropped.

    Raises `InputError` naming the file and the first key of an unknown layout.
    """
    prefixes = {
        "reader.": "reader",
        "retriever.contriever.": "retriever",
        "retriever.query_contriever.": "query",
        "retriever.passage_contriever.": "passage",
    }
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for raw_key, tensor in model_state.items():
        key = _strip_module(str(raw_key))
        for prefix, part in prefixes.items():
            if key.startswith(prefix):
                if not isinstance(tensor, torch.Tensor):
                    raise InputError(
                        source, None, f"model.{raw_key}", f"expected a tensor, got {type(tensor).__name__}"
                    )
                parts.setdefault(part, {})[key[len(prefix) :]] = tensor
                break
        else:
            raise InputError(
                source,
                None,
                f"model.{raw_key}",
                "unknown key layout: an Atlas checkpoint's keys start with reader., "
                "retriever.contriever. (tied) or retriever.query_contriever. and "
                "retriever.passage_contriever. (untied), optionally with .module infixes",
            )
    if "reader" not in parts:
        raise InputError(source, None, "model", "no reader. tensors (a retrieve-only checkpoint cannot be imported)")
    if "retriever" in parts and ({"query", "passage"} & set(parts)):
        raise InputError(source, None, "model", "holds both a tied (retriever.contriever.) and an untied retriever")
    if ("query" in parts) != ("passage" in parts):
        missing = "passage" if "query" in parts else "query"
        raise InputError(source, None, "model", f"untied retriever without retriever.{missing}_contriever. tensors")
    return parts


def _option(opt: Any, name: str, default: Any = None) -> Any:
    if isinstance(opt, Mapping):
        return opt.get(name, default)
    return getattr(opt, name, default)


def config_from_options(opt: Any, *, tied: bool, closed_book: bool, source: str) -> tuple[AtlasConfig, list[str]]:
    """Our `AtlasConfig` from the reference's options (`opt`, a Namespace or dict), and notes
    on the options that have no counterpart here (for import.json)."""
    # long: a table of the reference's options and the config keys they become, one entry per option
    notes: list[str] = []
    if closed_book and _option(opt, "use_file_passages") and not _option(opt, "closed_book"):
        notes.append(
            "use_file_passages (passages read from the data files, no retriever saved): "
            "task.closed_book = true, the reader sees the query alone; to read the data files' "
            "passages set task.closed_book=false and a retriever.model"
        )
    base = AtlasConfig()
    text_maxlength = int(_option(opt, "text_maxlength", 200))
    retriever_length = min(text_maxlength, BERT_MAX_LENGTH)
    mode = _option(opt, "gold_score_mode", "ppmean")
    loss = GOLD_SCORE_MODES.get(mode)
    if loss is None:
        notes.append(f"gold_score_mode {mode!r} has no counterpart: retriever.loss = pdist")
        loss = "pdist"
    if not _option(opt, "train_retriever", True):
        loss = "none"  # the reference trained only the reader
    retriever = dataclasses.replace(
        base.retriever,
        pooling="mean",
        tied=tied,
        # the reference's EMDR² mixes per token (SPEC); keep its behaviour for a faithful continuation
        loss=LossConfig(name=loss, options={"granularity": "token"} if loss == "emdr" else {}),
        passage_format=_option(opt, "retriever_format", "{title} {text}"),
        query_maxlength=retriever_length,
        passage_maxlength=retriever_length,
        temperature_gold=float(_option(opt, "temperature_gold", 0.01)),
        temperature_score=float(_option(opt, "temperature_score", 0.01)),
        n_context=int(_option(opt, "retriever_n_context", base.retriever.n_context)),
    )
    target_maxlength = _option(opt, "target_maxlength")
    reader = dataclasses.replace(
        base.reader,
        n_context=int(_option(opt, "n_context", base.reader.n_context)),
        text_maxlength=text_maxlength,
        answer_maxlength=int(target_maxlength)
        if target_maxlength and int(target_maxlength) > 0
        else base.reader.answer_maxlength,
        passage_format=_option(opt, "encoder_format", base.reader.passage_format),
        dropout=float(_option(opt, "dropout")) if _option(opt, "dropout") is not None else None,
    )
    inference = dataclasses.replace(
        base.inference,
        generation_max_length=reference_new_tokens(_option(opt, "generation_max_length", REFERENCE_MAX_LENGTH)),
        num_beams=int(_option(opt, "generation_num_beams", base.inference.num_beams)),
        length_penalty=float(_option(opt, "generation_length_penalty", base.inference.length_penalty)),
        restore_surface=False,  # the reference decodes with the tokenizer alone, whatever the tokenizer
        reference_decoding=True,  # and with transformers 4's decode(skip_special_tokens=True)
        precision="fp32",  # in the reference's own arithmetic (no int8 or bf16 the reference never ran)
    )
    refresh = str(_option(opt, "refresh_index", "-1"))
    index = dataclasses.replace(
        base.index,
        refresh="never" if refresh.strip() in ("-1", "") else refresh,
        filtering_overretrieve_ratio=int(_option(opt, "filtering_overretrieve_ratio", 2)),
        reencode_candidates=int(_option(opt, "n_to_rerank_with_retrieve_with_rerank", 128))
        if _option(opt, "retrieve_with_rerank", False)
        else 0,
    )
    task_name = _option(opt, "task")
    name = TASK_NAMES.get(task_name or "qa")
    if name is None:
        notes.append(f"task {task_name!r} has no counterpart: task.name = qa")
        name = "qa"
    prompt = _option(opt, "qa_prompt_format")
    task = dataclasses.replace(
        base.task,
        name=name,
        options={"query_template": prompt} if name == "qa" and prompt else {},
        closed_book=closed_book,
        train_data=[str(p) for p in _option(opt, "train_data", []) or []],
        eval_data=[str(p) for p in _option(opt, "eval_data", []) or []],
    )
    training = dataclasses.replace(
        base.training,
        lr=float(_option(opt, "lr", base.training.lr)),
        lr_retriever=float(_option(opt, "lr_retriever", base.training.lr_retriever)),
        weight_decay=float(_option(opt, "weight_decay", base.training.weight_decay)),
        warmup_steps=int(_option(opt, "warmup_steps", base.training.warmup_steps)),
        steps=int(_option(opt, "total_steps", base.training.steps)),
        batch_size=int(_option(opt, "per_gpu_batch_size", base.training.batch_size)),
        accumulation_steps=int(_option(opt, "accumulation_steps", 1)),
        clip_norm=float(_option(opt, "clip", base.training.clip_norm)),
        scheduler=SCHEDULERS.get(_option(opt, "scheduler"), "linear"),
        precision="bf16" if _option(opt, "precision") == "bf16" else "fp32",
        seed=int(_option(opt, "seed", 0)),
    )
    min_length = _option(opt, "generation_min_length")
    if min_length is not None and int(min_length) > 1:
        notes.append(f"generation_min_length {min_length} has no counterpart: answers may be shorter")
    for name in ("decoder_format", "decoder_prompt_format"):
        if _option(opt, name):
            notes.append(f"{name} {_option(opt, name)!r} has no counterpart: targets are the task's own")
    if _option(opt, "precision") == "fp16":
        notes.append("precision fp16 has no counterpart (training runs in fp32 or bf16): training.precision = fp32")
    config = AtlasConfig(
        retriever=retriever, index=index, reader=reader, inference=inference, task=task, training=training
    )
    validate_components(config, source=source)
    return config, notes


def _tokenizer(path: str | None, kind: str, flag: str, source: str):
    if not path:
        raise InputError(source, None, "opt", f"names no {kind} tokenizer: pass {flag} FOLDER")
    try:
        if kind == "reader":
            return build_reader_tokenizer(path)
        return AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as e:
        raise ValueError(
            f"cannot load the {kind} tokenizer {path!r} ({str(e).splitlines()[0][:200]}); "
            f"without a network, pass {flag} with a local folder"
        ) from None


def _plain(value: Any) -> Any:
    """JSON-safe copy of an option value (paths and other objects as strings)."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def _import_retriever(
    parts: Mapping[str, dict[str, torch.Tensor]],
    config: AtlasConfig,
    *,
    encoder_source: str | None,
    retriever_config: str | None,
    source: str,
    notes: list[str],
) -> Retriever:
    """The `Retriever` holding a checkpoint's Contriever tensors (`parts` from `split_atlas_state`):
    one encoder when tied, query + passage when untied, mean pooling, unnormalised, as the
    reference's Contriever ("average"), with the reference's layer norm (`ReferenceLayerNorm`: its BERT
    is its own src/modeling_bert.py). BERT's head count comes from `retriever_config`, else the
    `encoder_source` folder's config.json, else hidden_size / 64 (noted in `notes`)."""
    tied = "retriever" in parts
    bert_config = None
    if retriever_config:
        bert_config = read_config_file(retriever_config, BertConfig)
    elif encoder_source and (Path(encoder_source) / "config.json").is_file():
        bert_config = read_config_file(encoder_source, BertConfig)
    if bert_config is None:
        notes.append(
            "retriever attention heads are not in any tensor shape: assumed hidden_size / 64 "
            "(Contriever's); pass --retriever-config if the encoder differs"
        )
    tokenizer = _tokenizer(encoder_source, "retriever", "--retriever-tokenizer", source)

    def encoder(state: dict[str, torch.Tensor]) -> ContrieverEncoder:
        return ContrieverEncoder(
            bert_from_state_dict(state, source, bert_config),
            tokenizer,
            pooling="mean",
            normalize=False,
            layer_norm="reference",
        )

    return Retriever(
        query_encoder=encoder(parts["retriever" if tied else "query"]),
        passage_encoder=None if tied else encoder(parts["passage"]),
        passage_format=config.retriever.passage_format,
        query_maxlength=config.retriever.query_maxlength,
        passage_maxlength=config.retriever.passage_maxlength,
    )


def import_atlas_checkpoint(
    src: str | Path,
    out: str | Path,
    *,
    reader_tokenizer: str | None = None,
    retriever_tokenizer: str | None = None,
    reader_config: str | None = None,
    retriever_config: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Import a facebookresearch/atlas checkpoint as a run folder at `out`; returns the checkpoint folder.

    reader_tokenizer / retriever_tokenizer: local folders (default: the checkpoint's
    `opt.reader_model_type` / `opt.retriever_model_path`, hub names that need a network).
    reader_config / retriever_config: a config.json (or its folder) for the T5 / BERT
    architecture (default: read from the tensors' shapes; a retriever folder given as
    `retriever_tokenizer` with a config.json supplies BERT's head count). The folder is
    written atomically: on any error nothing is left at `out`.
    """
    # long: the import's steps in the order they run (options, retriever, reader, config, record), each a few lines;
    # split, they would hand a dozen values from one to the next
    file = find_checkpoint_file(src)
    source = str(file)
    out = Path(out)
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists (pass --overwrite to replace it)")
    checkpoint = load_torch_file(file)
    if not isinstance(checkpoint, Mapping) or not isinstance(checkpoint.get("model"), Mapping):
        raise InputError(source, None, "model", "not an Atlas checkpoint (expected a dict with a 'model' state dict)")
    opt = checkpoint.get("opt") or {}
    step = int(checkpoint.get("step") or 0)
    parts = split_atlas_state(checkpoint["model"], source)
    tied = "retriever" in parts
    closed_book = not tied and "query" not in parts
    if closed_book and not (_option(opt, "closed_book") or _option(opt, "use_file_passages")):
        raise InputError(source, None, "model", "no retriever. tensors, and the options say it retrieved")

    t5, tokenizer, conversions = _import_reader(
        parts["reader"], opt, reader_config=reader_config, reader_tokenizer=reader_tokenizer, source=source
    )
    config, notes = config_from_options(opt, tied=tied, closed_book=closed_book, source=source)

    encoder_source = retriever_tokenizer or _option(opt, "retriever_model_path")
    retriever = None
    if not closed_book:
        retriever = _import_retriever(
            parts, config, encoder_source=encoder_source, retriever_config=retriever_config, source=source, notes=notes
        )
    conversions.append(
        {
            "what": "inference.generation_max_length",
            "reference": _plain(_option(opt, "generation_max_length", REFERENCE_MAX_LENGTH)),
            "here": config.inference.generation_max_length,
            "why": "the reference's generate(max_length) counts the decoder start token; ours counts new tokens",
        }
    )
    if retriever is not None:
        conversions.append(
            {
                "what": "retriever layer norm",
                "reference": "BertLayerNorm of src/modeling_bert.py: (x - mean(x)) / sqrt(mean(x^2) + eps) * w + b",
                "here": "layer_norm: reference",
                "eps": float(retriever.query_encoder.model.config.layer_norm_eps),
                "why": "the reference's BERT divides by the raw second moment, not the variance",
            }
        )

    name = f"step-{step:06d}"
    final = out.resolve() / "checkpoints" / name
    # the config points at the imported weights, so `atlas train CONFIG` fine-tunes from them
    config.reader.model = config.reader.tokenizer = str(final / "reader")
    if retriever is not None:
        config.retriever.model = str(final / "retriever")
    config.training.output_dir = str(out.resolve())
    skipped = sorted(k for k in checkpoint if k not in ("model", "opt", "step") and checkpoint[k] is not None)
    record = {
        "source": str(file.resolve()),
        "format": "facebookresearch/atlas model.pth.tar",
        "step": step,
        "reader": {"model_type": _plain(_option(opt, "reader_model_type")), **t5.config.to_diff_dict()},
        "retriever": None if retriever is None else {"tied": tied, "source": _plain(encoder_source)},
        "not_imported": {
            k: "the reference's optimizer/scheduler state: a run started from this checkpoint builds fresh ones"
            for k in skipped
        },
        "conversions": conversions,
        "notes": notes,
        "options": _plain(vars(opt) if isinstance(opt, argparse.Namespace) else opt),
    }
    with atomic_directory(out, overwrite=overwrite) as tmp:
        folder = tmp / "checkpoints" / name
        folder.mkdir(parents=True)
        FiDReader(t5).save_pretrained(folder / "reader")
        tokenizer.save_pretrained(str(folder / "reader"))
        if retriever is not None:
            retriever.save_pretrained(folder / "retriever")
        save_config(config, folder / "config.yaml")
        save_config(config, tmp / "config.yaml")
        atomic_write_json(folder / "import.json", record)
        atomic_write_text(tmp / "checkpoints" / "latest", name + "\n")
    logger.info("imported %s (step %d) into %s", file, step, out)
    return out / "checkpoints" / name


def _import_reader(
    state: dict[str, torch.Tensor], opt, *, reader_config: str | None, reader_tokenizer: str | None, source: str
) -> tuple[Any, Any, list[dict[str, Any]]]:
    """The reader of a checkpoint: (its T5 model from the `reader.` tensors `state`, its tokenizer
    segmenting as the reference's did, the import.json records of what either needed converted)."""
    t5_config = read_config_file(reader_config, T5Config) if reader_config else None
    t5 = t5_from_state_dict(state, source, t5_config)
    tokenizer = _tokenizer(
        reader_tokenizer or _option(opt, "reader_model_type"), "reader", "--reader-tokenizer", source
    )
    conversions = _reader_conversions(t5)
    tokenizer, segmentation = _reference_segmentation(tokenizer)
    if segmentation is not None:
        conversions.append(segmentation)
    if len(tokenizer) > t5.config.vocab_size:
        raise InputError(
            source,
            None,
            "reader.shared.weight",
            f"{t5.config.vocab_size} token embeddings, but the reader tokenizer has {len(tokenizer)} tokens",
        )
    return t5, tokenizer, conversions


def _reader_conversions(t5) -> list[dict[str, Any]]:
    """import.json records of what the reader's tensors needed beyond loading: an own `lm_head`, a
    transformers-3 cross-attention bias."""
    conversions: list[dict[str, Any]] = []
    if isinstance(t5, UntiedT5ForConditionalGeneration):
        conversions.append(
            {
                "what": "reader lm_head",
                "reference": "lm_head.weight differs from shared.weight (T5 v1.1 / lm-adapt)",
                "here": "own lm_head, config.json tie_word_embeddings: false",
                "why": "transformers 5's T5Config always says tied",
            }
        )
    if has_cross_attention_bias(t5):
        conversions.append(
            {
                "what": "reader cross-attention position bias",
                "reference": CROSS_BIAS_KEY,
                "here": "kept and added to every decoder block's cross-attention (config: "
                "cross_attention_relative_bias)",
                "why": "saved and used by transformers < 4; transformers >= 4 drops it",
            }
        )
    return conversions


def _reference_segmentation(tokenizer) -> tuple[Any, dict[str, Any] | None]:
    """The reader tokenizer splitting text as the reference's transformers 4 did, and its import.json
    record; a tokenizer that is not a T5 SentencePiece one is kept as it is (None)."""
    try:
        converted = reference_t5_tokenizer(tokenizer)
    except ValueError:
        return tokenizer, None
    return converted, {
        "what": "reader tokenizer segmentation",
        "reference": "transformers 4.18 T5 tokenizer: a space before a "
        "special token is a token '▁' of its own ('answer: <extra_id_0>' ends ':', '▁', '<extra_id_0>')",
        "here": "the same normaliser and pre-tokenizer, saved in tokenizer.json (a PreTrainedTokenizerFast)",
        "why": "transformers 5's T5 tokenizer splits on whitespace first and drops that '▁'",
    }


# an HF folder's weights, in the order looked for: one file, or shards listed by an index (what save_pretrained
# writes above its shard size: a T5-XL reader and larger)
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def fid_weights_file(folder: Path) -> Path:
    """The weights file (or shard index) of an HF-style folder; InputError naming the folder where there is none."""
    for name in WEIGHT_FILES:
        if (folder / name).is_file():
            return folder / name
    raise InputError(folder, None, None, f"no weights: expected one of {', '.join(WEIGHT_FILES)}")


def _read_weights_file(file: Path) -> dict[str, torch.Tensor]:
    """The tensors of one safetensors file or one torch file (safe-loaded)."""
    if file.suffix == ".safetensors":
        try:
            return load_file(str(file))
        except (SafetensorError, OSError) as e:
            raise InputError(file, None, None, f"unreadable ({e})") from None
    state = load_torch_file(file, mmap=False)
    if not isinstance(state, Mapping):
        raise InputError(file, None, None, f"expected a state dict, got {type(state).__name__}")
    return dict(state)


def _read_fid_state(folder: Path) -> dict[str, torch.Tensor]:
    """The tensors of an HF-style folder: one weights file, or every shard its index names (each shard checked to
    hold the tensors the index maps to it)."""
    file = fid_weights_file(folder)
    if not file.name.endswith(".index.json"):
        return _read_weights_file(file)
    try:
        weight_map = json.loads(file.read_text(encoding="utf-8"))["weight_map"]
    except (ValueError, KeyError, TypeError) as e:
        raise InputError(file, None, "weight_map", f"not a shard index ({e})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise InputError(file, None, "weight_map", "expected an object of tensor name → shard file name")
    state: dict[str, torch.Tensor] = {}
    for shard in sorted(set(weight_map.values())):
        if Path(shard).name != shard:  # the index names files beside it, never a path elsewhere
            raise InputError(file, None, "weight_map", f"shard {shard!r} is not a file name in {folder}")
        tensors = _read_weights_file(folder / shard)
        expected = {name for name, owner in weight_map.items() if owner == shard}
        if missing := expected - tensors.keys():
            raise InputError(
                folder / shard, None, None, f"lacks {len(missing)} tensors its index lists, e.g. {min(missing)}"
            )
        state.update(tensors)
    return state


def fid_to_t5_keys(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """FiDT5 keys → T5 keys: `encoder.encoder.` → `encoder.`, checkpoint wrappers' `.module` dropped."""
    out = {}
    for key, tensor in state.items():
        key = _strip_module(key)
        if key.startswith("encoder.encoder."):
            key = key[len("encoder.") :]
        out[key] = tensor
    return out


def import_fid_reader(
    src: str | Path, out: str | Path, *, tokenizer: str | None = None, overwrite: bool = False
) -> Path:
    """Import a facebookresearch/FiD reader folder (config.json + FiDT5 weights) as a plain
    HF T5 reader folder at `out` (with the reader tokenizer), usable as `reader.model=OUT`; its `atlas.yaml`
    keeps answers decoded as the reference decoded them (`inference.restore_surface: false`,
    `inference.reference_decoding: true`, `inference.precision: fp32`).

    tokenizer: a local tokenizer folder (default: `src` when it holds one). Written atomically.
    """
    src, out = Path(src), Path(out)
    if not (src / "config.json").is_file():
        raise InputError(src / "config.json", None, None, "not found: a FiD reader folder holds config.json")
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} already exists (pass --overwrite to replace it)")
    config = read_config_file(src, T5Config)
    state = fid_to_t5_keys(_read_fid_state(src))
    weights = fid_weights_file(src)
    t5 = t5_from_state_dict(state, str(weights), config)
    has_tokenizer = any((src / n).is_file() for n in ("tokenizer.json", "spiece.model", "tokenizer_config.json"))
    reader_tokenizer = _tokenizer(tokenizer or (str(src) if has_tokenizer else None), "reader", "--tokenizer", str(src))

    with atomic_directory(out, overwrite=overwrite) as tmp:
        FiDReader(t5).save_pretrained(tmp / "reader")
        for item in (tmp / "reader").iterdir():
            os.replace(item, tmp / item.name)
        (tmp / "reader").rmdir()
        reader_tokenizer.save_pretrained(str(tmp))
        # FiD decodes with the tokenizer alone, transformers 3's decode(skip_special_tokens=True), in float32
        settings = {"inference": {"restore_surface": False, "reference_decoding": True, "precision": "fp32"}}
        atomic_write_text(tmp / READER_SETTINGS_FILE, yaml.safe_dump(settings, sort_keys=False))
        atomic_write_json(
            tmp / "import.json",
            {
                "source": str(src.resolve()),
                "format": "facebookresearch/FiD FiDT5",
                "weights": weights.name,
                "conversions": _reader_conversions(t5),
            },
        )
    return out
