"""``localchat serve``'s embeddings (``/v1/embeddings``, Ollama's ``/api/embed`` and
``/api/embeddings``) through the ``openai`` SDK and the ``ollama`` library, on a real server
over the real test model (mean-pooled: a chat model's own weights) and over a synthetic
embedding GGUF loaded beside it; and every request a client gets wrong, a 400 naming the field."""

from __future__ import annotations

import json

import httpx
import numpy as np
import ollama
import pytest
from serve_fixtures import MODEL, openai_client, running

from localchat.engine.embedder import PACK_TOKENS
from localchat.models.user_registry import add_user_entry
from localchat.serve.http import Limits

pytestmark = pytest.mark.model

SHORT = [f"Sentence {i}: the {['cat', 'dog', 'bird', 'fish'][i % 4]} ran home at {i} o'clock."
         for i in range(64)]


@pytest.fixture(scope="module")
def server(serve_host):
    """A server over the test model for this module (its body cap 64 KiB)."""
    with running(serve_host) as app:
        yield app


@pytest.fixture(scope="module")
def client(server):
    return openai_client(server)


def vectors(response) -> np.ndarray:
    return np.array([item.embedding for item in response.data], dtype=np.float32)


def post(server, path: str, body: dict | bytes) -> httpx.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.base_url + path, content=data, timeout=60,
                      headers={"Content-Type": "application/json"})


def test_openai_sdk_gets_normalised_vectors_as_floats_and_as_base64(client):
    as_floats = client.embeddings.create(model=MODEL, input=SHORT[:3], encoding_format="float")
    as_base64 = client.embeddings.create(model=MODEL, input=SHORT[:3])  # the SDK's default

    floats = vectors(as_floats)
    assert floats.shape == (3, 576) and [d.index for d in as_floats.data] == [0, 1, 2]
    assert np.allclose(np.linalg.norm(floats, axis=1), 1.0, atol=1e-5)
    assert np.array_equal(floats, vectors(as_base64))  # the same bits, decoded by the SDK
    assert as_floats.model == MODEL and as_floats.object == "list"
    assert as_floats.usage.prompt_tokens == as_floats.usage.total_tokens > 3


def test_identical_inputs_give_identical_vectors(client):
    first = vectors(client.embeddings.create(model=MODEL, input="The same words.", encoding_format="float"))
    again = vectors(client.embeddings.create(model=MODEL, input="The same words.", encoding_format="float"))
    twice = vectors(client.embeddings.create(model=MODEL, input=["The same words."] * 2,
                                             encoding_format="float"))

    assert np.array_equal(first, again)
    assert np.allclose(twice[0], twice[1], atol=1e-5) and np.allclose(first[0], twice[0], atol=1e-2)


def test_a_batch_of_64_equals_the_inputs_embedded_one_by_one(client):
    batch = vectors(client.embeddings.create(model=MODEL, input=SHORT))
    alone = np.concatenate([vectors(client.embeddings.create(model=MODEL, input=text))
                            for text in SHORT])

    # Other batch shapes round differently; the same direction within float tolerance.
    assert batch.shape == (64, 576)
    assert np.min(np.sum(batch * alone, axis=1)) > 0.999


def test_inputs_longer_than_a_decode_packs_embed_alone_and_equal_themselves_embedded_by_one(client):
    """Short inputs share a decode of up to PACK_TOKENS tokens; one longer than that (up to the
    context) goes alone, between them, and every vector keeps its input's place."""
    long_text = " ".join(f"word{i}" for i in range(150))  # over PACK_TOKENS, within 512
    inputs = [SHORT[0], long_text, SHORT[1], SHORT[2], long_text + " again"]
    response = client.embeddings.create(model=MODEL, input=inputs)
    each = [client.embeddings.create(model=MODEL, input=text) for text in inputs]

    assert PACK_TOKENS < each[1].usage.prompt_tokens < 512
    assert np.min(np.sum(vectors(response) * np.concatenate([vectors(e) for e in each]),
                         axis=1)) > 0.999


def test_paraphrases_are_closer_than_unrelated_sentences(client):
    cat, paraphrase, revenue = vectors(client.embeddings.create(model=MODEL, input=[
        "The cat sat on the mat.", "A cat was sitting on the mat.",
        "Quarterly revenue rose by four percent."]))

    assert cat @ paraphrase > max(cat @ revenue, paraphrase @ revenue)


def test_token_ids_embed_as_their_text_does(client, serve_host):
    ids = serve_host.engine.tokenize("Token ids work too.")
    by_text = vectors(client.embeddings.create(model=MODEL, input="Token ids work too."))
    by_ids = vectors(client.embeddings.create(model=MODEL, input=[ids]))
    single = vectors(client.embeddings.create(model=MODEL, input=ids))

    assert np.array_equal(by_ids, single) and np.allclose(by_text, by_ids, atol=1e-5)


def test_ollama_library_embed_and_older_embeddings(server, client):
    ollama_client = ollama.Client(host=server.base_url)

    embedded = ollama_client.embed(model=MODEL, input=["A red apple.", "A green pear."])
    older = ollama_client.embeddings(model=f"{MODEL}:latest", prompt="A red apple.")

    assert embedded.model == f"{MODEL}:latest" and len(embedded.embeddings) == 2
    assert embedded.prompt_eval_count > 2 and embedded.total_duration > 0
    openai_vector = vectors(client.embeddings.create(model=MODEL, input="A red apple."))[0]
    assert np.allclose(older.embedding, openai_vector, atol=1e-5)
    assert np.allclose(embedded.embeddings[0], openai_vector, atol=1e-2)


def test_the_chats_cache_is_untouched_by_embeddings_in_between(client):
    messages = [{"role": "user", "content": "Name a fruit."}]
    options = {"temperature": 0, "max_tokens": 8}
    client.chat.completions.create(model=MODEL, messages=messages, **options)

    client.embeddings.create(model=MODEL, input=SHORT)
    again = client.chat.completions.create(model=MODEL, messages=messages, **options)

    usage = again.usage  # every prompt token but the last came from the cache, as without
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1


def test_an_input_over_the_context_is_refused_by_openai_and_cut_by_ollama(server):
    long_text = "word " * 2000

    refused = post(server, "/v1/embeddings", {"model": MODEL, "input": ["short", long_text]})
    cut = post(server, "/api/embed", {"model": MODEL, "input": long_text})
    kept = post(server, "/api/embed", {"model": MODEL, "input": long_text, "truncate": False})

    assert refused.status_code == 400 and refused.json()["error"]["param"] == "input[1]"
    assert "at most 512" in refused.json()["error"]["message"]
    assert cut.status_code == 200 and cut.json()["prompt_eval_count"] == 512
    assert kept.status_code == 400 and "at most 512" in kept.json()["error"]


BAD = [
    ({"input": []}, "input", "is empty"),
    ({"input": ""}, "input", "empty string"),
    ({"input": ["a", ""]}, "input[1]", "empty string"),
    ({"input": ["a", 3]}, "input[1]", "must be a string or an array of token ids"),
    ({"input": ["a", {"text": "b"}]}, "input[1]", "must be a string"),
    ({"input": [[1, 2], [3, "x"]]}, "input[1][1]", "must be a token id"),
    ({"input": [1, -5]}, "input[1]", "must be a token id"),
    ({"input": [[1, 10**9]]}, "input[0][1]", "ids 0 to 49151"),
    ({}, "input", "is missing"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format", "\"float\" or \"base64\""),
    ({"input": "a", "dimensions": 128}, "dimensions", "must be 576"),
]


@pytest.mark.parametrize(("body", "param", "says"), BAD)
def test_openai_requests_a_client_gets_wrong_are_400s_naming_the_field(server, body, param, says):
    response = post(server, "/v1/embeddings", {"model": MODEL, **body})

    error = response.json()["error"]
    assert response.status_code == 400, error
    assert error["param"] == param and says in error["message"]


def test_ollama_requests_a_client_gets_wrong_are_400s(server):
    for body, says in [({"input": [1, 2]}, "input[0] must be a string"),
                       ({"input": []}, "input is empty"), ({"prompt": 5}, "prompt must be a string"),
                       ({"input": "a", "truncate": "yes"}, "truncate must be true or false")]:
        path = "/api/embeddings" if "prompt" in body else "/api/embed"
        response = post(server, path, {"model": MODEL, **body})
        assert response.status_code == 400 and says in response.json()["error"], body


def test_an_unknown_model_is_a_404_as_for_chats(server):
    response = post(server, "/v1/embeddings", {"model": "no-such-model", "input": "a"})
    ollama_response = post(server, "/api/embed", {"model": "no-such-model", "input": "a"})

    assert response.status_code == 404 and response.json()["error"]["param"] == "model"
    assert ollama_response.status_code == 404 and "unknown" in ollama_response.json()["error"]


def test_100000_inputs_or_10_mb_of_text_are_400s_when_the_body_cap_lets_them_in(serve_host):
    limits = Limits(max_body_bytes=32 * 1024**2, request_timeout_s=30.0, idle_timeout_s=30.0)
    many = {"model": MODEL, "input": ["x"] * 100_000}
    huge = {"model": MODEL, "input": ["x" * (5 * 1024**2)] * 2}
    with running(serve_host, limits=limits) as app:
        too_many = post(app, "/v1/embeddings", many).json()["error"]
        too_much = post(app, "/api/embed", huge)

    assert too_many["param"] == "input" and "100,000 inputs; at most 2,048" in too_many["message"]
    assert too_much.status_code == 400 and "more than 8 MB" in too_much.json()["error"]


def test_an_embedding_model_is_loaded_beside_the_chat_model_and_listed(server, client,
                                                                       synthetic_model):
    add_user_entry("embed-tiny", {"path": str(synthetic_model("embed-tiny")),
                                  "kind": "embedding", "family": "test"})
    ollama_client = ollama.Client(host=server.base_url)

    listed = [m.id for m in client.models.list().data]
    response = client.embeddings.create(model="embed-tiny", input=SHORT[:5])
    shown = ollama_client.show("embed-tiny")
    chat = post(server, "/v1/chat/completions", {"model": "embed-tiny",
                                                 "messages": [{"role": "user", "content": "hi"}]})
    still_chats = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)

    assert "embed-tiny" in listed and "embed-tiny:latest" in [m.model for m in ollama_client.list().models]
    found = vectors(response)
    assert found.shape == (5, 256) and np.allclose(np.linalg.norm(found, axis=1), 1.0, atol=1e-5)
    assert shown.capabilities == ["embedding"]
    assert chat.status_code == 400 and "embedding model" in chat.json()["error"]["message"]
    assert still_chats.model == MODEL  # the chat model stayed loaded


def test_a_task_waiting_when_the_server_stops_ends_with_the_shutdown_error():
    import asyncio
    import threading
    import types

    from localchat.serve.http_errors import ShuttingDown
    from localchat.serve.scheduler import Scheduler
    from localchat.serve.task import Task

    started, release = threading.Event(), threading.Event()
    host = types.SimpleNamespace(parallel=1, loaded=None)  # tasks run one at a time
    scheduler = Scheduler(host, max_queue=4)  # type: ignore[arg-type]
    running = Task(lambda host: started.set() or release.wait(10))
    waiting = Task(lambda host: "never run")
    scheduler.submit(running)
    scheduler.submit(waiting)
    assert started.wait(10)
    closing = threading.Thread(target=scheduler.close)
    closing.start()

    with pytest.raises(ShuttingDown):
        asyncio.run(waiting.result())
    release.set()
    closing.join(10)
    assert asyncio.run(running.result()) is True  # the running one ends with its answer
