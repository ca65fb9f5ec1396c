"""Atlas wiring: retrieval with evidence passages (pretext tasks that teach reading)."""

from __future__ import annotations

import numpy as np
import pytest

from tasks.base import Example
from tasks.passage import Passage


def _model(tiny_world):
    from atlas.config import load_config
    from atlas.loading import load_model, recipe_spec

    return load_model(
        recipe_spec(
            load_config(
                None,
                [
                    f"retriever.model={tiny_world['encoder']}",
                    f"index.path={tiny_world['index']}",
                    "reader.model=t5-tiny",
                    "retriever.loss=none",
                ],
            )
        )
    )


def test_a_missed_evidence_passage_replaces_the_last_retrieved_one(tiny_world):
    model = _model(tiny_world)
    query = "The capital of Zorbland"
    plain = model.retrieve([Example(id="q", query=query, target=None, answers=[])], 3)[0]
    ranked = model.retrieve([Example(id="q", query=query, target=None, answers=[])], 5)[0]
    assert all(isinstance(p, Passage) and p.score is not None and p.row is not None for p in ranked)
    missed = ranked[-1]  # a passage the top-3 search does not return
    evidence = Passage(id=missed.id, title=missed.title, text=missed.text)
    example = Example(id="q", query=query, target=None, answers=[], evidence=evidence)
    got = model.retrieve([example], 3)[0]
    assert [p.id for p in got] == [p.id for p in plain[:2]] + [missed.id]
    # scored as the search scores it (stored float16 vector · query), ≈ a fresh encoding's score
    assert np.isclose(got[-1].score, missed.score, atol=1e-6) and got[-1].row == missed.row
    fresh = float(model.retriever.embed_passages([evidence.fields()])[0] @ model.retriever.embed_queries([query])[0])
    assert np.isclose(got[-1].score, fresh, atol=2e-3)
    # evidence among the top-k: read as given (an excerpt here) in place of its own copy
    excerpt = Passage(id=plain[1].id, title=plain[1].title, text=plain[1].text[:20])
    found = Example(id="q", query=query, target=None, answers=[], evidence=excerpt)
    got = model.retrieve([found], 3)[0]
    assert [p.id for p in got] == [p.id for p in plain]
    assert got[1].text == excerpt.text and np.isclose(got[1].score, plain[1].score, atol=1e-6)
    assert [p.text for p in got[::2]] == [p.text for p in plain[::2]]


def test_evidence_outside_the_index_is_encoded_and_inside_it_read_from_the_index(tiny_world):
    model = _model(tiny_world)
    query = "The capital of Zorbland"
    query_vector = model.retriever.embed_queries([query])[0]
    inside = model.passage_index.passages([3])[0]
    scored = model._scored_evidence(Passage(id=inside["id"], title=inside["title"], text=inside["text"]), query_vector)
    assert scored.row == 3 and model.passage_index.position_of(inside["id"]) == 3
    stored = model.passage_index.embeddings([3])[0]
    assert scored.score == float(stored @ query_vector)  # the stored vector, bit for bit
    outside = Passage(id="new", title="Nowhere", text="Nothing is indexed about this.")
    scored = model._scored_evidence(outside, query_vector)
    assert scored.row is None and model.passage_index.position_of("new") is None
    assert np.isclose(scored.score, float(model.retriever.embed_passages([outside.fields()])[0] @ query_vector))


def test_dict_passages_of_an_example_become_passage_records():
    """Data files give an example's passages as dicts: they are records from the Example on."""
    example = Example(
        id="e",
        query="q",
        target=None,
        answers=[],
        passages=[{"id": "p", "title": "T", "text": "x", "wikipedia_id": ""}],
        evidence={"id": "v"},
    )
    assert example.passages == [Passage(id="p", title="T", text="x")] and example.evidence == Passage(id="v")
    with pytest.raises(KeyError, match="needs an 'id'"):
        Example(id="e", query="q", target=None, answers=[], passages=[{"text": "no id"}])


READERS = {
    "t5": ["reader.model=t5-tiny"],
    "warm-started": ["reader.model=minilm-fid-tiny", "reader.encoder={encoder}"],
}


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize(("n_read", "n_scored"), [(3, 3), (2, 4), (3, 2)])
def test_gold_scores_reuse_the_training_pass_only_where_it_is_exact(tiny_world, reader, n_read, n_scored):
    """Reader dropout 0.1 with `reader.encoder_dropout: false`: the training pass's encoder states are the
    eval-mode ones, so the retriever loss equals the loss with gold scores from a separate eval-mode
    encoder pass over every scored passage (the definition), while the encoder runs only over the
    passages nobody encoded yet. With encoder dropout on, every scored passage is encoded again."""
    import torch

    from atlas.config import load_config
    from atlas.loading import load_model, recipe_spec
    from tasks.base import get_task

    examples = get_task("qa").load(tiny_world["qa"])[:2]
    targets = [e.answers[0] for e in examples]
    losses, calls = {}, {}
    for encoder_dropout in (False, True):
        overrides = [o.format(encoder=tiny_world["encoder"]) for o in READERS[reader]]
        model = load_model(
            recipe_spec(
                load_config(
                    None,
                    [
                        f"retriever.model={tiny_world['encoder']}",
                        f"index.path={tiny_world['index']}",
                        *overrides,
                        "retriever.loss=pdist",
                        f"retriever.n_context={n_scored}",
                        f"reader.n_context={n_read}",
                        "reader.dropout=0.1",
                        f"reader.encoder_dropout={str(encoder_dropout).lower()}",
                        "reader.text_maxlength=48",
                        "training.seed=3",
                        "retriever.gold_precision=fp32",
                    ],
                )
            )
        )
        model.train()
        model.retriever.eval()  # deterministic retriever scores: the comparison is about the gold side
        assert model.reader.encoder_is_dropout_free() is not encoder_dropout
        rows: list[int] = []  # passages (B·K rows) of each encoder pass

        def counted(input_ids, *args, encode=model.reader.encode, rows=rows, **kwargs):
            rows.append(input_ids.shape[0] * input_ids.shape[1])  # the B·K passages of one encoder pass
            return encode(input_ids, *args, **kwargs)

        model.reader.encode = counted
        try:
            got = model.losses(examples, targets)["retriever"]
        finally:
            del model.reader.encode
        calls[encoder_dropout] = rows
        # the definition: gold from an eval-mode pass over all scored passages
        scored = [ps[:n_scored] for ps in model.retrieve(examples, max(n_read, n_scored))]
        ids, mask = model.reader_inputs([e.query for e in examples], scored)
        expected = model.retriever_loss(
            model.reader,
            model.retriever_scores([e.query for e in examples], scored),
            ids,
            mask,
            model.target_labels(targets),
            dim=model.retriever.dim,
            present=model.passage_presence(scored),
        )
        losses[encoder_dropout] = (got, expected)
    got, expected = losses[False]
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-4)
    assert calls[False] == [2 * n_read] + ([2 * (n_scored - n_read)] if n_scored > n_read else [])
    assert calls[True] == [2 * n_read, 2 * n_scored]  # the training pass, then an eval pass over all scored
    got, expected = losses[True]
    assert torch.allclose(got, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("reader", sorted(READERS))
def test_span_answers_are_spans_of_the_passages_each_question_read(tiny_world, reader):
    """`inference.span_answers: true`: whatever an untrained reader writes, `read` answers with a stretch
    of a passage its question read (and without the switch it does not)."""
    from atlas.config import load_config
    from atlas.loading import load_model, recipe_spec
    from tasks.base import get_task

    examples = get_task("qa").load(tiny_world["qa"])[:4]
    overrides = [o.format(encoder=tiny_world["encoder"]) for o in READERS[reader]]
    answers = {}
    for span_answers in (True, False):
        model = load_model(
            recipe_spec(
                load_config(
                    None,
                    [
                        f"retriever.model={tiny_world['encoder']}",
                        f"index.path={tiny_world['index']}",
                        *overrides,
                        "retriever.loss=none",
                        "reader.n_context=2",
                        "reader.text_maxlength=48",
                        "inference.num_beams=2",
                        "inference.length_penalty=0.0",
                        "inference.generation_max_length=5",
                        f"inference.span_answers={str(span_answers).lower()}",
                        "training.seed=1",
                    ],
                )
            )
        ).eval()
        passages = model.passages_for(examples, model.n_read)
        texts = model.read([e.query for e in examples], passages).texts
        answers[span_answers] = ([get_task("qa").postprocess(e, t) for e, t in zip(examples, texts)], passages)

    def inside(answer, passages):
        squash = "".join(answer.lower().split())
        return bool(squash) and any(squash in "".join(f"{p.title} {p.text}".lower().split()) for p in passages)

    predicted, passages = answers[True]
    assert all(inside(a, ps) for a, ps in zip(predicted, passages)), predicted
    predicted, passages = answers[False]
    assert not all(inside(a, ps) for a, ps in zip(predicted, passages)), predicted
