"""`atlas import …`: bring checkpoints and indexes of facebookresearch/atlas and FiD over."""

# Lazy imports: the handlers import atlas.importing (torch, transformers, faiss) when they run, so that
# `atlas --help` and argument errors answer at once.

from __future__ import annotations

import argparse
import json
import logging

from atlas.cli.index_commands import add_index_settings


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `atlas import atlas-checkpoint|fid-reader|atlas-index` to the `atlas` parser."""
    group = subparsers.add_parser(
        "import",
        help="import reference Atlas / FiD checkpoints and Atlas's saved indexes (pickles are "
        "loaded with an allow-list: no pickled code runs)",
    )
    commands = group.add_subparsers(dest="import_command", metavar="KIND", required=True)

    checkpoint = commands.add_parser(
        "atlas-checkpoint", help="a facebookresearch/atlas model.pth.tar → a run folder (evaluate, ask, train)"
    )
    checkpoint.add_argument("src", help="model.pth.tar, its step folder, or the reference run folder")
    checkpoint.add_argument("out", help="the run folder to write")
    checkpoint.add_argument(
        "--reader-tokenizer",
        metavar="DIR",
        help="reader tokenizer folder (default: the checkpoint's reader_model_type, from the hub)",
    )
    checkpoint.add_argument(
        "--retriever-tokenizer",
        metavar="DIR",
        help="retriever tokenizer (or whole Contriever) folder (default: the checkpoint's "
        "retriever_model_path, from the hub)",
    )
    checkpoint.add_argument("--reader-config", metavar="FILE", help="T5 config.json (default: from the tensor shapes)")
    checkpoint.add_argument(
        "--retriever-config",
        metavar="FILE",
        help="BERT config.json (default: the retriever folder's, else from the shapes with 64-wide attention heads)",
    )
    checkpoint.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    checkpoint.set_defaults(func=_atlas_checkpoint)

    fid = commands.add_parser("fid-reader", help="a facebookresearch/FiD reader folder → a T5 reader folder")
    fid.add_argument(
        "src", help="the FiD reader folder (config.json + pytorch_model.bin or model.safetensors, or their shards)"
    )
    fid.add_argument("out", help="the reader folder to write (use it as reader.model=OUT)")
    fid.add_argument("--tokenizer", metavar="DIR", help="reader tokenizer folder (default: SRC's own)")
    fid.add_argument("--overwrite", action="store_true", help="replace OUT if it exists")
    fid.set_defaults(func=_fid_reader)

    index = commands.add_parser(
        "atlas-index", help="Atlas's saved index shards (embeddings.{i}.pt, passages.{i}.pt) → a corpus + an index"
    )
    index.add_argument("src", help="the folder holding the shards")
    index.add_argument("--corpus-out", required=True, metavar="DIR", help="the corpus folder to write")
    index.add_argument("--index-out", required=True, metavar="DIR", help="the index folder to write")
    index.add_argument(
        "--encoder",
        required=True,
        metavar="DIR",
        help="the passage encoder the vectors came from: a run imported with `atlas import "
        "atlas-checkpoint`, a checkpoint, or a retriever/encoder folder",
    )
    add_index_settings(index, "spec", "train_sample", "keep_embeddings", "exact_rerank", "nprobe", "ef_search", "seed")
    index.add_argument("--overwrite", action="store_true", help="replace the outputs if they exist")
    index.add_argument("--restart", action="store_true", help="discard an interrupted import instead of resuming")
    index.set_defaults(func=_atlas_index)


def _atlas_checkpoint(args: argparse.Namespace) -> int:
    from atlas.importing.reference_checkpoint import import_atlas_checkpoint

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    folder = import_atlas_checkpoint(
        args.src,
        args.out,
        reader_tokenizer=args.reader_tokenizer,
        retriever_tokenizer=args.retriever_tokenizer,
        reader_config=args.reader_config,
        retriever_config=args.retriever_config,
        overwrite=args.overwrite,
    )
    record = json.loads((folder / "import.json").read_text())
    print(
        f"imported step {record['step']} into {args.out} (checkpoint {folder.name}); "
        f"not imported: {', '.join(record['not_imported']) or 'nothing'}"
    )
    _print_conversions(record)
    print(f"next: atlas evaluate {args.out} --data DATA --index INDEX")
    return 0


def _fid_reader(args: argparse.Namespace) -> int:
    from atlas.importing.reference_checkpoint import import_fid_reader

    out = import_fid_reader(args.src, args.out, tokenizer=args.tokenizer, overwrite=args.overwrite)
    print(f"imported the FiD reader into {out}; use it as reader.model={out}")
    _print_conversions(json.loads((out / "import.json").read_text()))
    return 0


def _print_conversions(record: dict) -> None:
    """One line per conversion import.json records (docs/guides/coming-from-reference.md)."""
    for conversion in record.get("conversions", []):
        print(f"converted {conversion['what']}: {conversion['here']}")


def _atlas_index(args: argparse.Namespace) -> int:
    from atlas.importing.reference_index import import_atlas_index
    from retriever.index.settings import IndexSettings

    corpus, index = import_atlas_index(
        args.src,
        corpus_out=args.corpus_out,
        index_out=args.index_out,
        encoder=args.encoder,
        settings=IndexSettings.of(args),
        overwrite=args.overwrite,
        restart=args.restart,
    )
    print(f"corpus written to {corpus}, index to {index}; check it with `atlas index info --index {index} --verify`")
    return 0
