"""atlas, the system. The Python API: `atlas.Atlas` (load, answer, fine-tune, evaluate, save) and `atlas.Index`
(build, load, search, edit), with `atlas.Answer` the record an answer comes in.

Core: `config`, `model` (retriever + reader wiring), `loading`, `assembly`, `run_index`, `evaluate`, `distributed`,
`real_size`, `api`, `index_api`; rooms above it: `training/`, then the front ends `cli/`, `serve/`, `demo/`,
`importing/`; below it: `knnlm/`. May import `tasks`, `retriever`, `reader`; those never import atlas."""

__all__ = ["Answer", "Atlas", "Index"]


def __getattr__(name: str):
    # The API's names are imported when first used, so that `atlas --help` and the command line's argument
    # errors answer without loading torch.
    if name in ("Atlas", "Answer"):
        from atlas import api  # heavy: the model's modules load with the first use

        return getattr(api, name)
    if name == "Index":
        from atlas.index_api import Index  # as above

        return Index
    raise AttributeError(f"module 'atlas' has no attribute {name!r}")
