"""The passage index, a storage engine of its own: an index folder's format and its checks (`files`), building
one (`build`), opening and searching it (`passage_index`), editing it in place (`update`), compacting it
(`compact`), the index types and exact search (`types`), the exact re-rank of a compressed index's candidates
(`rerank`), a search split over ranks (`sharded`) and vectors computed elsewhere (`vectors`).

`PassageIndex` and the errors a caller catches are importable from here (`retriever.index.PassageIndex`), on first
use: importing the package is light, so that `retriever.index.settings` serves configuration and argument parsing
without loading faiss.
"""

import importlib

_EXPORTS = {
    "CorpusMismatchError": "retriever.index.files",
    "EncoderMismatchError": "retriever.index.files",
    "IndexLockedError": "retriever.index.files",
    "InvalidIndexError": "retriever.index.files",
    "PassageIndex": "retriever.index.passage_index",
}


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'retriever.index' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)


__all__ = list(_EXPORTS)
