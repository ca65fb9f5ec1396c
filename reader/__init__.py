"""The reader: Fusion-in-Decoder (`fid`), the warm-started reader (`warm_start`: BERT encoder + T5 decoder
+ copy head), tokenizer, inputs, decoding surface, and the per-passage scores the retriever losses distil
from (`passage_scores`, `attention_scores`). May import `tasks`; never `retriever` or `atlas`."""
