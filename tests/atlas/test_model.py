"""Atlas wiring: retrieval with evidence passages (pretext tasks that teach reading)."""

from __future__ import annotations

import numpy as np

from tasks.base import Example


def _model(tiny_world):
    from atlas.build import build_atlas
    from atlas.config import load_config

    return build_atlas(load_config(None, [f"retriever.model={tiny_world['encoder']}", f"index.path={tiny_world['index']}",
                                          "reader.model=t5-tiny", "retriever.loss=none"]))


def test_a_missed_evidence_passage_replaces_the_last_retrieved_one(tiny_world):
    model = _model(tiny_world)
    query = "The capital of Zorbland"
    plain = model.retrieve([Example(id="q", query=query, target=None, answers=[])], 3)[0]
    ranked = model.retrieve([Example(id="q", query=query, target=None, answers=[])], 5)[0]
    missed = ranked[-1]  # a passage the top-3 search does not return
    evidence = {"id": missed["id"], "title": missed["title"], "text": missed["text"]}
    example = Example(id="q", query=query, target=None, answers=[], evidence=evidence)
    got = model.retrieve([example], 3)[0]
    assert [p["id"] for p in got] == [p["id"] for p in plain[:2]] + [missed["id"]]
    # scored as the search scores it (stored float16 vector · query), ≈ a fresh encoding's score
    assert np.isclose(got[-1]["score"], missed["score"], atol=1e-6) and got[-1]["row"] == missed["row"]
    fresh = float(model.retriever.embed_passages([evidence])[0] @ model.retriever.embed_queries([query])[0])
    assert np.isclose(got[-1]["score"], fresh, atol=2e-3)
    # evidence among the top-k: read as given (an excerpt here) in place of its own copy
    excerpt = {"id": plain[1]["id"], "title": plain[1]["title"], "text": plain[1]["text"][:20]}
    found = Example(id="q", query=query, target=None, answers=[], evidence=excerpt)
    got = model.retrieve([found], 3)[0]
    assert [p["id"] for p in got] == [p["id"] for p in plain]
    assert got[1]["text"] == excerpt["text"] and np.isclose(got[1]["score"], plain[1]["score"], atol=1e-6)
    assert [p["text"] for p in got[::2]] == [p["text"] for p in plain[::2]]


def test_evidence_outside_the_index_is_encoded_and_inside_it_read_from_the_index(tiny_world):
    model = _model(tiny_world)
    query = "The capital of Zorbland"
    query_vector = model.retriever.embed_queries([query])[0]
    inside = model.index.passages([3])[0]
    scored = model._scored_evidence({k: inside[k] for k in ("id", "title", "text")}, query_vector)
    assert scored["row"] == 3 and model.index.position_of(inside["id"]) == 3
    stored = model.index.embeddings([3])[0]
    assert scored["score"] == float(stored @ query_vector)  # the stored vector, bit for bit
    outside = {"id": "new", "title": "Nowhere", "text": "Nothing is indexed about this."}
    scored = model._scored_evidence(outside, query_vector)
    assert "row" not in scored and model.index.position_of("new") is None
    assert np.isclose(scored["score"], float(model.retriever.embed_passages([outside])[0] @ query_vector))
