"""Importing what users of the reference implementations hold: facebookresearch/atlas
checkpoints and saved indexes, and facebookresearch/FiD readers, into this project's formats.

    safe_pickle.py   loading their pickles without running pickled code (an explicit allow-list)
    weights.py       reference state dicts → Hugging Face T5 / BERT models (config from shapes)
    checkpoint.py    `model.pth.tar` → a run folder; FiD reader folders → a reader folder
    index.py         `embeddings.{i}.pt` + `passages.{i}.pt` shards → an Arrow corpus + an index

What the reference computed differently from a stock Hugging Face model is converted and listed
in import.json (docs/guides/coming-from-reference.md).
"""
