"""Stage 2 of atlas-mini pretraining: the passages of a prepared corpus under new ids.

    python -m atlas.demo.copy_passages runs/pretrain-mini-corpus runs/pretrain-mini-copy.jsonl

Span corruption over these records is *not* filtered for trivial retrievals (the ids differ from
the index's), so the retriever usually hands the reader the very passage that was corrupted and
the masked words can be copied from it. Stage 1 (filtered, as Atlas does) teaches word statistics;
at this tiny compute it does not teach the reader to look things up in its passages, and this
copy stage does: it is the reading skill that few-shot QA fine-tuning then builds on.
"""

from __future__ import annotations

import argparse

from retriever.corpus import Corpus
from tasks.io import write_jsonl


def write_copy_passages(corpus_path: str, out: str, prefix: str = "copy:") -> int:
    """Write every passage of the prepared corpus as {"id": prefix + id, "title", "text"}; → count."""
    corpus = Corpus.load(corpus_path)
    return write_jsonl(out, ({"id": prefix + p["id"], "title": p["title"], "text": p["text"]}
                             for _, batch in corpus.iter_batches(4096) for p in batch))


def main(argv: list[str] | None = None) -> int:
    """Command line: CORPUS OUT."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("corpus")
    parser.add_argument("out")
    args = parser.parse_args(argv)
    print(f"{write_copy_passages(args.corpus, args.out)} passages → {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
