"""The reader: a Fusion-in-Decoder T5 (`fid`), its tokenizer (`tokenizer`), input encoding
(`inputs`) and the per-passage scores the retriever losses distil from (`passage_scores`,
`attention_scores`)."""
