"""`atlas serve`: the API in-process, a bounded load test on loopback, and a real browser.

One model load for the module: the shipped atlas-reader over the demo encyclopedia (greedy,
one torch thread), served from a copy of the demo index that the tests edit. Each test edits
passages no other test reads, so the order does not matter.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import threading
from pathlib import Path

import pytest

fastapi = pytest.importorskip("fastapi", reason="atlas serve needs fastapi (pip install -e '.[test]')")
from fastapi.testclient import TestClient

from atlas.cli import main as atlas_main
from atlas.serve import AtlasService, create_app
from atlas.serve.demo import build_demo_run

REPO = Path(__file__).resolve().parents[2]
CAPITAL = "What is the capital of Biole?"
TOKEN = "test-token-0123456789"  # long enough: atlas serve refuses tokens under 16 characters
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _bench():
    """bench/serve.py as a module (its load generator and server helpers)."""
    spec = importlib.util.spec_from_file_location("bench_serve", REPO / "bench" / "serve.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """The demo run loaded once, serving (and editing) its own copy of the demo index. Automatic
    compaction is off (each edit is then exactly one generation, which tests count); the tests of
    compaction turn it on."""
    import torch

    from atlas.api import Atlas

    run = build_demo_run(tmp_path_factory.getbasetemp() / "serve-demo")
    index = tmp_path_factory.mktemp("serve-api") / "index"
    shutil.copytree(run.parent / "index", index)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the suite shares 2 cores; more threads only contend
    model = Atlas.from_pretrained(run, index=index, overrides=["inference.num_beams=1"])
    service = AtlasService(model, auto_compact=False)
    yield service
    service.close()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def client(service):
    """In-process, as a loopback client that carries the edit token."""
    app = create_app(service, allow_edits=True, token=TOKEN)
    with TestClient(app, base_url="http://127.0.0.1", headers=AUTH) as client:
        yield client


@pytest.fixture(scope="module")
def live_url(service):
    """The same service under uvicorn on a loopback port (a real socket), for the load and browser tests."""
    import uvicorn

    from atlas.serve import ServeSettings, uvicorn_config

    bench = _bench()
    port = bench.free_port()
    settings = ServeSettings(allow_edits=True, token=TOKEN)
    app = create_app(service, settings)
    server = uvicorn.Server(uvicorn_config(app, settings, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    bench.wait_healthy(url, timeout=60)
    yield url
    server.should_exit = True
    thread.join(timeout=30)


# ----------------------------------------------------------------------------- questions
def test_ask_answers_with_evidence_and_the_passage_it_read(client):
    response = client.post("/api/ask", json={"question": CAPITAL, "k": 2})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["answer"].lower() == "stafairk" and body["k"] == 2 and body["batch_size"] >= 1
    evidence = body["evidence"]
    assert evidence[0]["id"] == "country-biole" and len(evidence) == 2
    assert evidence[0]["score"] >= evidence[1]["score"]
    assert sum(e["attention"] for e in evidence) == pytest.approx(1.0, abs=1e-4)
    assert body["attended"] == "country-biole"  # the passage the answer is read from
    text = evidence[0]["text"]
    start = text.index("Stafairk")  # where the fixture's passage holds the answer, found by hand
    assert body["citations"][0] == {
        "passage_id": "country-biole",
        "field": "text",
        "start": start,
        "end": start + len("Stafairk"),
        "quote": "Stafairk",
    }
    assert body["supported"] is True
    for citation in body["citations"]:  # every one slices its passage back to the answer's words
        passage = next(e for e in evidence if e["id"] == citation["passage_id"])
        assert passage[citation["field"]][citation["start"] : citation["end"]] == citation["quote"]
        assert citation["quote"].lower() == "stafairk"


def test_batch_ask_and_search(client):
    questions = [CAPITAL, "What is the capital of Dreagriodros?"]
    response = client.post("/api/ask/batch", json={"questions": questions})
    assert response.status_code == 200, response.text
    answers = response.json()["answers"]
    assert [a["question"] for a in answers] == questions
    assert [a["answer"].lower() for a in answers] == ["stafairk", "tidroth"]
    assert [(a["citations"][0]["passage_id"], a["citations"][0]["quote"].lower()) for a in answers] == [
        ("country-biole", "stafairk"),
        ("country-dreagriodros", "tidroth"),
    ]
    assert all(a["supported"] for a in answers)
    assert all(a["k"] == 2 for a in answers)  # the run's reader.n_context
    assert answers[0]["batch_size"] == 2  # one forward pass for both
    hits = client.post("/api/search", json={"query": "the capital of Biole", "k": 4}).json()["hits"]
    assert len(hits) == 4 and hits[0]["id"] == "country-biole"
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)


def test_info_describes_the_run_and_health_the_index(client, service):
    info = client.get("/api/info").json()
    manifest = service.index.manifest
    assert info["reader"]["class"] == "WarmStartedT5" and info["reader"]["parameters"] > 10**7
    assert (
        info["retriever"]["passage_fingerprint"] == info["index"]["encoder_fingerprint"] == manifest.encoder_fingerprint
    )
    assert info["index"]["spec"] == "Flat" and info["index"]["passages"] == len(service.index) >= 136
    serving = info["serving"]
    assert serving["edits_allowed"] is True and serving["token_required"] is True and "token" not in serving
    assert (serving["max_batch"], serving["batch_window_ms"], serving["default_k"]) == (32, 5.0, 2)
    assert (serving["max_request_cost"], serving["max_batch_cost"], serving["max_queue"]) == (640, 80, 256)
    health = client.get("/api/health").json()
    assert health["status"] == "ok" and health["generation"] == manifest.generation
    assert client.get("/").text.startswith("<!doctype html>")
    assert "/api/ask" in client.get("/openapi.json").json()["paths"]


# ----------------------------------------------------------------------------- errors
LONG = "x" * 2001


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "message"),
    [
        ("POST", "/api/ask", "{not json", 400, "malformed JSON body"),
        ("POST", "/api/ask", {"question": "   "}, 422, "the question is empty"),
        ("POST", "/api/ask", {"question": LONG}, 422, "at most 2000 characters"),
        ("POST", "/api/ask", {"question": "q", "k": 0}, 422, "body.k"),
        ("POST", "/api/ask", {"question": "q", "k": 21}, 422, "less than or equal to 20"),
        ("POST", "/api/ask", {"k": 2}, 422, "body.question: Field required"),
        ("POST", "/api/ask/batch", {"questions": ["q"] * 65}, 422, "at most 64 items"),
        (
            "POST",
            "/api/ask/batch",
            {"questions": ["q", "\u3000 "]},
            422,
            "body.questions.1: Value error, the question is empty",
        ),
        ("POST", "/api/search", {"query": "q", "k": 101}, 422, "less than or equal to 100"),
        # what the schema used to allow and the server refused (issue 35): now the schema says it too
        ("POST", "/api/ask", {"question": ""}, 422, "body.question: String should have at least 1 character"),
        (
            "POST",
            "/api/ask/batch",
            {"questions": [""]},
            422,
            "body.questions.0: String should have at least 1 character",
        ),
        ("POST", "/api/search", {"query": "", "k": 99}, 422, "body.query: String should have at least 1 character"),
        ("PUT", "/api/passages/country-biole", {"text": ""}, 422, "body.text: String should have at least 1 character"),
        (
            "POST",
            "/api/edits",
            {"remove": ["country-biole"] * 63},
            422,
            "body.remove: Value error, each id once; repeated: 'country-biole'",
        ),
        (
            "POST",
            "/api/passages",
            {"passages": [{"id": "empty", "text": ""}]},
            422,
            "body.passages.0.text: String should have at least 1 character",
        ),
        # and what the schema forbade and the server took: a boolean (or a string) for an integer
        ("POST", "/api/search", {"query": "q", "k": True}, 422, "body.k: Input should be a valid integer"),
        ("POST", "/api/ask", {"question": "q", "k": "2"}, 422, "body.k: Input should be a valid integer"),
        ("POST", "/api/ask", {"question": "q", "top_k": 2}, 422, "body.top_k: Extra inputs are not permitted"),
        (
            "GET",
            "/api/passages/%20country-biole",
            None,
            422,
            "path.passage_id: Value error, a passage id has 1 to 256 characters, no white space first or last",
        ),
        ("GET", "/api/passages/no-such-passage", None, 404, "no passage with id 'no-such-passage'"),
        ("PUT", "/api/passages/no-such-passage", {"text": "t"}, 404, "no passage with id(s) 'no-such-passage'"),
        ("DELETE", "/api/passages/no-such-passage", None, 404, "'no-such-passage'"),
        ("PUT", "/api/passages/country-biole", {"text": "y" * 20001}, 422, "at most 20000 characters"),
        ("POST", "/api/passages", {"passages": [{"id": "country-biole", "text": "t"}]}, 409, "already in the index"),
        ("POST", "/api/passages", {"passages": [{"id": " x", "text": "t"}]}, 422, "white space"),
        ("POST", "/api/edits", {}, 422, "the edit is empty"),
        (
            "POST",
            "/api/edits",
            {"update": [{"id": "country-biole", "text": "t"}], "remove": ["country-biole"]},
            409,
            "repeated: 'country-biole'",
        ),  # valid by the schema (it cannot say it), a conflict within the edit
    ],
)
def test_bad_requests_get_a_4xx_with_a_clear_message(client, method, path, body, status, message):
    content = body if isinstance(body, str) else None
    response = client.request(
        method, path, content=content, json=None if content else body, headers={"content-type": "application/json"}
    )
    assert response.status_code == status, response.text
    assert message in response.json()["detail"]
    assert client.get("/api/health").status_code == 200  # still serving


def test_the_published_schema_refuses_what_the_server_refuses(client):
    """Each body the server answers 422 above is invalid by the OpenAPI schema too, and what the
    server takes is valid by it (a client generated from the schema finds out before sending)."""
    jsonschema_rs = pytest.importorskip("jsonschema_rs", reason="comes with schemathesis (pip install -e '.[test]')")
    openapi = client.get("/openapi.json").json()

    def valid(model: str, body) -> bool:
        schema = {"$ref": f"#/components/schemas/{model}", "components": openapi["components"]}
        return jsonschema_rs.validator_for(schema).is_valid(body)

    refused = [
        ("AskRequest", {"question": ""}),
        ("AskRequest", {"question": " \t"}),
        ("AskRequest", {"question": "q", "k": True}),
        ("AskRequest", {"question": "q", "k": 21}),
        ("AskRequest", {"question": "q", "top_k": 2}),
        ("BatchAskRequest", {"questions": [""]}),
        ("SearchRequest", {"query": "", "k": 99}),
        ("PassageUpdate", {"text": ""}),
        ("EditRequest", {"remove": ["x"] * 63}),
        ("EditRequest", {}),
        ("EditRequest", {"add": []}),
        ("AddRequest", {"passages": [{"id": "x", "text": ""}]}),
        ("AddRequest", {"passages": [{"id": " x", "text": "t"}]}),
        ("AddRequest", {"passages": [{"id": "x\ny", "text": "t"}]}),
    ]
    for model, body in refused:
        assert not valid(model, body), (model, body)
    taken = [
        ("AskRequest", {"question": "q", "k": 2}),
        ("AskRequest", {"question": "q", "k": 2.0}),
        ("SearchRequest", {"query": " q "}),
        ("EditRequest", {"remove": ["x", "y"]}),
        ("AddRequest", {"passages": [{"id": "a b", "text": "t"}]}),
    ]
    for model, body in taken:
        assert valid(model, body), (model, body)
        path = {"AskRequest": "/api/ask", "SearchRequest": "/api/search"}.get(model)
        if path is not None:
            assert client.post(path, json=body).status_code == 200


@pytest.mark.parametrize("method", ["OPTIONS", "PATCH", "POST"])
def test_a_method_a_path_does_not_serve_is_answered_with_the_ones_it_does(client, method):
    response = client.request(method, "/api/passages/country-biole")
    assert response.status_code == 405 and response.headers["allow"] == "DELETE, GET, PUT"  # the schema's three
    assert response.json()["detail"] == f"{method} is not served at this path; it serves DELETE, GET, PUT"
    assert set(client.get("/openapi.json").json()["paths"]["/api/passages/{passage_id}"]) == {"get", "put", "delete"}
    response = client.request(method, "/api/ask") if method != "POST" else client.get("/api/ask")
    assert response.status_code == 405 and response.headers["allow"] == "POST"


def test_an_oversized_body_is_refused_before_it_is_read(client):
    response = client.post("/api/ask", content=b"x" * 6_000_000, headers={"content-type": "application/json"})
    assert response.status_code == 413 and response.headers["content-type"] == "application/json"
    assert response.json()["detail"] == "the body is 6,000,000 bytes; the limit of this endpoint is 833,536"


def test_edits_are_off_unless_allowed_and_need_the_token_when_one_is_set(service):
    with TestClient(create_app(service), base_url="http://127.0.0.1") as plain:
        response = plain.delete("/api/passages/country-biole")
        assert response.status_code == 403 and "--allow-edits" in response.json()["detail"]
        assert plain.post("/api/ask", json={"question": CAPITAL}).status_code == 200  # asking still works
    with TestClient(
        create_app(service, allow_edits=True, token="s3cret-s3cret-s3cret"), base_url="http://127.0.0.1"
    ) as guarded:
        body = {"passages": [{"id": "token-test", "text": "Guarded text."}]}
        assert guarded.post("/api/passages", json=body).status_code == 401
        wrong = guarded.post("/api/passages", json=body, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and "Bearer" in wrong.json()["detail"]
        right = guarded.post("/api/passages", json=body, headers={"Authorization": "Bearer s3cret-s3cret-s3cret"})
        assert right.status_code == 200 and right.json()["added"] == ["token-test"]
        assert guarded.get("/api/info").json()["serving"]["token_required"] is True


# ----------------------------------------------------------------------------- corpus edits
def test_an_edit_changes_the_answer_at_once_and_is_committed_on_disk(client, service):
    from retriever.index import PassageIndex

    question = "What is the capital of Dreagriodros?"
    assert client.post("/api/ask", json={"question": question}).json()["answer"].lower() == "tidroth"
    before = client.get("/api/health").json()
    text = client.get("/api/passages/country-dreagriodros").json()["text"].replace("Tidroth", "Morvale")
    response = client.put("/api/passages/country-dreagriodros", json={"text": text})
    assert response.status_code == 200, response.text
    edit = response.json()
    assert edit["updated"] == ["country-dreagriodros"] and edit["count"] == before["passages"]
    assert edit["generation"] == before["generation"] + 1
    after = client.post("/api/ask", json={"question": question}).json()
    assert after["answer"].lower() == "morvale" and after["generation"] == edit["generation"]
    on_disk = PassageIndex.load(service.index.folder)  # what a restart would serve
    assert on_disk.passages([on_disk.position_of("country-dreagriodros")])[0]["text"] == text
    assert len(on_disk) == before["passages"]
    assert atlas_main(["index", "info", "--index", str(service.index.folder), "--verify"]) == 0


def test_add_update_remove_in_one_atomic_edit(client):
    count = client.get("/api/health").json()["passages"]
    added = client.post(
        "/api/passages",
        json={
            "passages": [
                {"id": "isle-a", "title": "Isle A", "text": "Isle A is ruled by Queen Ysolde."},
                {"id": "isle-b", "title": "Isle B", "text": "Isle B exports copper."},
            ]
        },
    ).json()
    assert added["added"] == ["isle-a", "isle-b"] and added["count"] == count + 2
    edit = client.post(
        "/api/edits",
        json={
            "add": [{"id": "isle-c", "text": "Isle C has one harbour."}],
            "update": [{"id": "isle-a", "text": "Isle A is ruled by King Odo."}],
            "remove": ["isle-b"],
        },
    )
    assert edit.status_code == 200, edit.text
    assert edit.json()["count"] == count + 2 and edit.json()["generation"] == added["generation"] + 1
    assert client.get("/api/passages/isle-a").json() == {
        "id": "isle-a",
        "title": "Isle A",
        "text": "Isle A is ruled by King Odo.",
    }
    assert client.get("/api/passages/isle-b").status_code == 404
    hits = client.post("/api/search", json={"query": "Who rules Isle A?", "k": 3}).json()["hits"]
    assert hits[0]["id"] == "isle-a" and "Odo" in hits[0]["text"]
    assert client.delete("/api/passages/isle-c").json()["count"] == count + 1
    # a refused edit changes nothing: one unknown id sinks the whole request
    refused = client.post("/api/edits", json={"add": [{"id": "isle-d", "text": "D."}], "remove": ["isle-zz"]})
    assert refused.status_code == 404 and client.get("/api/passages/isle-d").status_code == 404


def test_the_server_compacts_its_index_between_batches_and_no_result_changes(client, service):
    """With automatic compaction on, the edit that leaves the index due for one is followed by a
    compaction on the edit thread, swapped in between two batches: fewer segments, one more
    generation, and the same hits (ids and scores) and answers as before it."""
    from retriever.index.compact import MAX_SEGMENTS

    def settled() -> dict:
        service.edit_executor.submit(lambda: None).result()  # what was queued on the edit thread ran
        return client.get("/api/health").json()

    start = settled()
    fillers = [f"filler-{n}" for n in range(MAX_SEGMENTS + 1 - start["segments"])]
    for pid in fillers:  # one segment each: one segment too many
        assert (
            client.post(
                "/api/passages",
                json={
                    "passages": [
                        {
                            "id": pid,
                            "title": "Filler",
                            "text": f"{pid} is a line of filler about nothing in particular.",
                        }
                    ]
                },
            ).status_code
            == 200
        )
    before = settled()
    assert before["segments"] == MAX_SEGMENTS + 1 and before["compactions"] == start["compactions"] == 0
    queries = ["the capital of Biole", "Who rules Isle A?", "What is the capital of Dreagriodros?"]
    hits = [client.post("/api/search", json={"query": q, "k": 10}).json()["hits"] for q in queries]
    assert not {h["id"] for found in hits for h in found} & set(fillers)  # so removing one changes no hit
    answer = client.post("/api/ask", json={"question": CAPITAL}).json()
    service.auto_compact = True
    try:
        edit = client.delete(f"/api/passages/{fillers[0]}").json()
        after = settled()
    finally:
        service.auto_compact = False
    assert after["compactions"] == 1 and after["segments"] == 2  # the base and the merged edits
    assert after["generation"] == edit["generation"] + 1 == before["generation"] + 2
    assert after["passages"] == before["passages"] - 1 and after["dead_rows"] <= before["dead_rows"]
    assert [client.post("/api/search", json={"query": q, "k": 10}).json()["hits"] for q in queries] == hits
    again = client.post("/api/ask", json={"question": CAPITAL}).json()
    assert (again["answer"], again["evidence"], again["generation"]) == (
        answer["answer"],
        answer["evidence"],
        after["generation"],
    )
    assert atlas_main(["index", "info", "--index", str(service.index.folder), "--verify"]) == 0


def test_an_edit_while_another_process_writes_the_index_is_answered_503(client, service):
    """The writer lock refuses a second writer at once (here: one the test holds, as `atlas index
    compact` from a shell would): the edit is not made, the server says why, and goes on."""
    from retriever.index.files import writer_lock

    before = client.get("/api/health").json()
    with writer_lock(service.index.folder, "compact"):
        response = client.put("/api/passages/country-biole", json={"text": "Biole has no capital."})
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert response.json()["detail"].startswith(
        f"{service.index.folder} is being updated by another process (pid {os.getpid()}, compact since "
    )
    assert client.get("/api/health").json()["generation"] == before["generation"]
    assert "Stafairk" in client.get("/api/passages/country-biole").json()["text"]


def test_a_commit_made_from_a_shell_is_served_from_the_next_question_and_logged(client, service, caplog):
    """`atlas index update` run beside the server (another writer of the same folder): the next search reads the
    new generation, and the server's log says it picked it up."""
    import logging

    from atlas.cli import main

    before = client.get("/api/health").json()["generation"]
    original = client.get("/api/passages/country-biole").json()
    fix = service.index.folder.parent / "fix.jsonl"
    fix.write_text(json.dumps({"id": "country-biole", "title": "Biole", "text": "Biole's capital is Zanthorp."}) + "\n")
    caplog.set_level(logging.INFO, logger="atlas.serve.service")
    try:
        assert main(["index", "update", "--index", str(service.index.folder), "--corpus", str(fix)]) == 0
        hits = client.post("/api/search", json={"query": "capital of Biole", "k": 1}).json()
        assert hits["generation"] == before + 1 and "Zanthorp" in hits["hits"][0]["text"]
        assert f"generation {before} -> {before + 1}, committed by another process" in caplog.text
        assert client.get("/api/health").json()["generation"] == before + 1
    finally:  # the module's later tests (the browser's) ask about Biole and expect the fixture's capital
        fix.write_text(json.dumps({key: original[key] for key in ("id", "title", "text")}) + "\n")
        assert main(["index", "update", "--index", str(service.index.folder), "--corpus", str(fix)]) == 0


# ----------------------------------------------------------------------------- load
@pytest.mark.slow
def test_a_bounded_load_with_interleaved_edits_loses_nothing(live_url, service):
    """The suite's size of bench/serve.py's load test (1,000 asks + 50 edits there)."""
    bench = _bench()
    before = httpx_get(f"{live_url}/api/health")["passages"]
    plan = bench.edit_plan(6, "load")
    service.auto_compact = True  # as `atlas serve` runs
    try:
        result = bench.load_test(
            live_url, bench.heldout_questions(32), asks=48, concurrency=16, k=2, plan=plan, token=TOKEN
        )
    finally:
        service.auto_compact = False
    print("\nload test:", json.dumps(result))
    assert result["errors"] == 0 and result["edit_errors"] == 0, result["error_examples"]
    assert result["mean_batch"] > 1.5  # concurrent questions did share forward passes
    checked = bench.check_edits(live_url, plan, before)
    assert checked["lost_edits"] == [] and checked["passages"] == checked["expected_passages"]
    assert len(service.index) == checked["passages"] == service.index.manifest.count
    assert atlas_main(["index", "info", "--index", str(service.index.folder), "--verify"]) == 0


def httpx_get(url: str) -> dict:
    import httpx

    return httpx.get(url, timeout=30).raise_for_status().json()


# ----------------------------------------------------------------------------- browser
def _chromium():
    """A headless Chromium driven by selenium, or a skip saying why there is none."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
    from selenium.webdriver.chrome.service import Service

    browser = next((p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser") if Path(p).exists()), None)
    driver = shutil.which("chromedriver") or next(
        (p for p in ("/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver") if Path(p).exists()), None
    )
    if browser is None or driver is None:
        pytest.skip(
            "no Chromium/chromedriver here: install the Debian packages chromium and chromium-driver "
            "(.ci/run does so when it runs as root)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1000,1100",
    ):
        options.add_argument(argument)
    return webdriver.Chrome(service=Service(executable_path=driver), options=options)


def test_the_page_asks_shows_evidence_edits_and_shows_the_new_answer(live_url, service):
    import httpx
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as seen
    from selenium.webdriver.support.ui import WebDriverWait

    browser = _chromium()
    try:
        wait = WebDriverWait(browser, 60)
        browser.get(f"{live_url}/#token={TOKEN}")  # the link `atlas serve --allow-edits` prints
        wait.until(lambda b: b.find_element(By.ID, "run").text != "loading…")
        browser.find_element(By.ID, "question").send_keys("What is the capital of Biole?")
        browser.find_element(By.ID, "ask").click()
        wait.until(seen.visibility_of_element_located((By.CSS_SELECTOR, "#evidence .passage")))
        assert browser.find_element(By.ID, "answer").text.lower() == "stafairk"
        attended = browser.find_element(By.CSS_SELECTOR, "#evidence .passage.attended")
        assert attended.get_attribute("data-id") == "country-biole"
        assert attended.find_element(By.TAG_NAME, "mark").text.lower() == "stafairk"  # the answer, highlighted
        result = browser.execute_script("return state.last")  # the /api/ask response the page showed
        assert result["citations"][0]["passage_id"] == "country-biole"
        for card in browser.find_elements(By.CSS_SELECTOR, "#evidence .passage"):  # a mark for each citation
            cited = [c for c in result["citations"] if c["passage_id"] == card.get_attribute("data-id")]
            assert _marks(card) == [(c["field"], c["start"], c["end"], c["quote"]) for c in cited]
        shots = service.checkpoint  # the run folder, for humans to look at
        browser.save_screenshot(str(shots / "serve-page-before.png"))

        attended.find_element(By.CSS_SELECTOR, "button.edit").click()
        text = browser.find_element(By.ID, "edit-text")
        edited = text.get_attribute("value").replace("Stafairk", "Quillmoor")
        text.clear()
        text.send_keys(edited)
        browser.find_element(By.ID, "edit-save").click()
        wait.until(seen.text_to_be_present_in_element((By.ID, "answer-change"), "→"))
        assert browser.find_element(By.ID, "answer").text.lower() == "quillmoor"
        assert "stafairk → quillmoor" in browser.find_element(By.ID, "answer-change").text.lower()
        first = browser.find_element(By.CSS_SELECTOR, "#evidence .passage")
        assert "Quillmoor" in first.text and "Stafairk" not in first.text
        browser.save_screenshot(str(shots / "serve-page-after.png"))
        assert (shots / "serve-page-after.png").stat().st_size > 10_000

        # a passage holding HTML is shown as its text: no element made from it, no script run
        title, text = (
            "Vexmoor <i>isle</i>",
            'Its capital is Ulbrin <b>x</b> <img src=x onerror="window.pwned=1">; Ulbrinville is a town.',
        )
        added = httpx.post(
            f"{live_url}/api/passages",
            json={"passages": [{"id": "markup-vexmoor", "title": title, "text": text}]},
            headers=AUTH,
            timeout=60,
        )
        assert added.status_code == 200, added.text
        question = browser.find_element(By.ID, "question")
        question.clear()
        question.send_keys("What is the capital of Vexmoor?")
        browser.find_element(By.ID, "ask").click()
        card = wait.until(
            seen.presence_of_element_located((By.CSS_SELECTOR, '#evidence .passage[data-id="markup-vexmoor"]'))
        )
        assert card.find_element(By.CSS_SELECTOR, ".title").text == title
        assert card.find_element(By.TAG_NAME, "p").text == text
        assert browser.find_elements(By.CSS_SELECTOR, "#evidence b, #evidence i, #evidence img") == []
        assert browser.execute_script("return window.pwned") is None
        # the mark is the reader's answer where the citation puts it: "Ulbrin", not the "Ulbrin" of "Ulbrinville"
        assert browser.find_element(By.ID, "answer").text == "Ulbrin"
        start = text.index("Ulbrin")
        assert _marks(card) == [("text", start, start + len("Ulbrin"), "Ulbrin")]
    finally:
        browser.quit()
        httpx.delete(f"{live_url}/api/passages/markup-vexmoor", headers=AUTH, timeout=60)


def _marks(card) -> list[tuple[str, int, int, str]]:
    """The marked words of a passage card: (field, start, end, the words)."""
    from selenium.webdriver.common.by import By

    return [
        (m.get_attribute("data-field"), int(m.get_attribute("data-start")), int(m.get_attribute("data-end")), m.text)
        for m in card.find_elements(By.TAG_NAME, "mark")
    ]
