"""Nearest-neighbour language modelling: hidden-state keys (`lm`), the token datastore (`datastore`),
search and interpolation (`search`), representation dispersion (`dispersion`). May import
`retriever` (index types, fingerprints), `common.io` and `common.json_fields`; not the rest of `atlas`."""
