"""The reader: Fusion-in-Decoder (`fid`), the warm-started reader (`warm_start`: BERT encoder + T5 decoder
+ copy head), tokenizer, inputs, decoding surface, and the per-passage scores the retriever losses distil
from (`passage_scores`, `attention_scores`). Readers imported from the reference implementations keep
what they were trained with: an own output layer (`t5_untied`), transformers 3's cross-attention
bias (`cross_attention_bias`), transformers 4's T5 tokenization (`tokenizer.reference_t5_tokenizer`).
May import `tasks`; never `retriever` or `atlas`."""
