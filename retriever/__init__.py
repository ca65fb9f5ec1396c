"""The retriever: the Contriever-style encoder, the passage corpus (Arrow), the index (build, search,
update, re-rank, sharding, index types), retrieval metrics and the retriever losses. May import
`tasks` (I/O, metrics); never `reader` or `atlas`."""
