"""The passage index, a storage engine of its own: an index folder's format and its checks (`files`), building
one (`build`), opening and searching it (`passage_index`), editing it in place (`update`), compacting it
(`compact`), the index types and exact search (`types`), the exact re-rank of a compressed index's candidates
(`rerank`), a search split over ranks (`sharded`) and vectors computed elsewhere (`vectors`).

`PassageIndex` and the errors a caller catches are importable from here (`retriever.index.PassageIndex`).
"""

from retriever.index.files import (
    CorpusMismatchError,
    EncoderMismatchError,
    IndexLockedError,
    InvalidIndexError,
)
from retriever.index.passage_index import PassageIndex

__all__ = [
    "CorpusMismatchError",
    "EncoderMismatchError",
    "IndexLockedError",
    "InvalidIndexError",
    "PassageIndex",
]
