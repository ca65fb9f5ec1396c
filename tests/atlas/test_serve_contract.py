"""`atlas serve` keeps the contract its OpenAPI schema publishes, checked by a property-based tester.

schemathesis reads the app's own `/openapi.json` and, in-process (ASGI, no socket), sends every
operation requests that the schema says are valid and requests it says are not, with the edit
endpoints on. It fails on a 5xx, on a valid request refused (a 4xx the schema does not allow for
valid data: 400, 422) or an invalid one accepted, on a status, body or header the schema does not
declare for the operation, and on an `Allow` header that names other methods than the schema's.

The run is real and small: a random 1-layer, 16-wide T5 reader and a 32-wide encoder over a
30-passage `Flat` index (answers are nonsense; the contract does not depend on them), so that even
the largest request the schema allows (64 questions reading 20 passages) would be read at once, were
it not over the reading budget (413).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

pytest.importorskip("fastapi", reason="atlas serve needs fastapi (pip install -e '.[test]')")
schemathesis = pytest.importorskip(
    "schemathesis", reason="the contract test needs schemathesis (pip install -e '.[test]')"
)

MAX_EXAMPLES = 6  # random requests per operation and mode, after the boundary cases: under a minute in all
TOKEN = "contract-token-0123"
# A valid request may also be refused 413: the reading budget of a question request (questions x k x length,
# settings.py) is a rule JSON Schema cannot state, as 409 answers an edit that names one id twice.
CONFIG = schemathesis.config.SchemathesisConfig.from_dict(
    {
        "headers": {"Authorization": f"Bearer {TOKEN}"},
        "checks": {
            "positive_data_acceptance": {
                "expected-statuses": ["2xx", "3xx", "401", "403", "404", "409", "413", "429", "5xx"]
            }
        },
    }
)


def _tiny_run(root: Path, tiny_encoder_path: Path) -> tuple[Path, Path]:
    """A reader folder (random tiny T5 + the reader tokenizer) and an index built with the tiny
    encoder (which the index records, so the server embeds queries with it)."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    from atlas.config import RetrieverConfig
    from reader.tokenizer import build_reader_tokenizer
    from retriever.corpus import prepare_corpus
    from retriever.index.build import build_index
    from retriever.retriever import Retriever

    tokenizer = build_reader_tokenizer(None)
    torch.manual_seed(0)
    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=16,
        d_kv=8,
        d_ff=32,
        num_heads=2,
        num_layers=1,
        num_decoder_layers=1,
        dropout_rate=0.0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    T5ForConditionalGeneration(config).save_pretrained(root / "reader")
    tokenizer.save_pretrained(root / "reader")
    (root / "docs.jsonl").write_text(
        "".join(
            json.dumps({"id": f"p{i}", "title": f"Place {i}", "text": f"Place {i} lies on river {i % 7}."}) + "\n"
            for i in range(30)
        )
    )
    prepare_corpus([root / "docs.jsonl"], root / "corpus", chunk_words=0, progress=False)
    build_index(
        root / "corpus",
        Retriever.from_config(RetrieverConfig(model=str(tiny_encoder_path))),
        root / "index",
        progress=False,
        encoder_source=str(tiny_encoder_path),
    )
    return root / "reader", root / "index"


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory, tiny_encoder_path):
    import torch

    from atlas.api import Atlas
    from atlas.serve import AtlasService, create_app

    reader, index = _tiny_run(tmp_path_factory.mktemp("serve-contract"), tiny_encoder_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    model = Atlas.from_pretrained(reader, index=index, overrides=["inference.num_beams=1"])
    service = AtlasService(model)
    # schemathesis's requests name the host `testserver`, and carry the edit token
    app = create_app(service, allow_edits=True, token=TOKEN, allowed_hosts=("testserver",))
    yield schemathesis.openapi.from_asgi("/openapi.json", app, config=CONFIG)
    from schemathesis.python.asgi import shutdown_lifespans

    shutdown_lifespans()  # the app's micro-batcher stops with its lifespan
    service.close()
    torch.set_num_threads(threads)


OPERATIONS = [
    ("POST", "/api/ask"),
    ("POST", "/api/ask/batch"),
    ("POST", "/api/search"),
    ("GET", "/api/passages/{passage_id}"),
    ("PUT", "/api/passages/{passage_id}"),
    ("DELETE", "/api/passages/{passage_id}"),
    ("POST", "/api/passages"),
    ("POST", "/api/edits"),
    ("GET", "/api/health"),
    ("GET", "/api/info"),
]


def test_the_schema_lists_every_operation(api_schema):
    listed = sorted(
        (operation.ok().method.upper(), operation.ok().path) for operation in api_schema.get_all_operations()
    )
    assert listed == sorted(OPERATIONS)


@pytest.mark.parametrize(("method", "path"), OPERATIONS)
def test_every_operation_keeps_its_schema_at_its_boundaries(api_schema, method, path):
    """schemathesis's coverage cases: each bound met and passed by one (the longest question, 64
    of them, k = 0, 21, ...), each type swapped, and the methods the path does not serve."""
    from schemathesis import GenerationMode

    operation = api_schema[path][method]
    config = api_schema.config.generation_for(operation=operation)
    cases = list(
        api_schema.iter_coverage_cases(operation, generation_modes=list(GenerationMode), generation_config=config)
    )
    assert cases
    for case in cases:
        case.call_and_validate()


WITH_INPUT = [operation for operation in OPERATIONS if operation[1] not in ("/api/health", "/api/info")]


@pytest.mark.parametrize(
    ("method", "path", "mode"),
    [(*operation, "positive") for operation in OPERATIONS] + [(*operation, "negative") for operation in WITH_INPUT],
)
def test_every_operation_keeps_its_schema(api_schema, method, path, mode):
    """`mode` positive: requests the schema says are valid must not get a 400 or 422 (404 and 409
    are the index's state: an id that is not live, or one that already is); negative: requests it
    says are invalid must get a 4xx (health and info take no input to get wrong). Every response
    must match what the operation declares."""
    from schemathesis import GenerationMode

    operation = api_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=GenerationMode(mode)))
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    def check(case) -> None:
        case.call_and_validate()

    check()
