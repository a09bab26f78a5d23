"""Pictures through ``localchat serve`` (issue 47, item 5) on real sockets with the real model and
the synthetic projector: OpenAI ``image_url`` data URLs from the ``openai`` SDK and Ollama
``images`` from the ``ollama`` library, each reply a fresh prefill's; a picture kept in its slot's
cells across turns; URLs the server would have to fetch or read refused, bad pictures and a model
without a projector each a 400 naming the field."""

from __future__ import annotations

import base64
import json
from dataclasses import replace

import ollama
import openai
import pytest
from image_fixture import png
from oracle import GREEDY, assert_text_matches_fresh, loaded_engine
from projector_fixture import write_mlp_projector
from serve_fixtures import MODEL, post, raw, running

from localchat.engine.vision import image_support
from localchat.models.registry import resolve_model
from localchat.serve.model_host import ModelHost
from localchat.settings import Settings

pytestmark = [pytest.mark.model,
              pytest.mark.skipif(not image_support().available, reason="no libmtmd in this build")]

EYES = "smol-eyes"
RED, BLUE = png(40, 30, (255, 0, 0)), png(40, 30, (0, 0, 255))
SAMPLING = {"temperature": 0, "max_tokens": 12, "extra_body": {"repeat_penalty": 1.0}}


def data_url(image: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(image).decode()


def asking(text: str, image: bytes) -> dict:
    return {"role": "user", "content": [{"type": "text", "text": text},
                                        {"type": "image_url", "image_url": {"url": data_url(image)}}]}


@pytest.fixture(scope="module")
def projector(tmp_path_factory):
    return write_mlp_projector(tmp_path_factory.mktemp("eyes") / "mmproj.gguf")


@pytest.fixture(scope="module")
def eyes_host(test_model_path, projector):
    spec = replace(resolve_model(str(test_model_path)), name=EYES, mmproj={"path": str(projector)})
    host = ModelHost(Settings(), spec, n_ctx=1024, cache_bytes=64 * 1024**2)
    host.acquire(host.default())
    yield host
    host.close()


@pytest.fixture(scope="module")
def eyes_oracle(test_model_path, projector):
    with loaded_engine(test_model_path, 1024, "oracle", speculative="off",
                       mmproj=projector) as engine:
        yield engine


def test_an_image_url_part_is_read_as_a_fresh_prefill_reads_it_and_stays_cached(eyes_host,
                                                                                 eyes_oracle):
    with running(eyes_host) as app:
        client = openai.OpenAI(base_url=app.base_url + "/v1", api_key="x", max_retries=0)
        first = client.chat.completions.create(
            model=EYES, messages=[asking("What is in this picture?", RED)], **SAMPLING)
        reply = first.choices[0].message.content
        follow = client.chat.completions.create(model=EYES, messages=[
            asking("What is in this picture?", RED), {"role": "assistant", "content": reply},
            {"role": "user", "content": "And its colour?"}], **SAMPLING)
    sampling = replace(GREEDY, max_tokens=12)
    assert_text_matches_fresh(reply, eyes_oracle, [
        {"role": "user", "content": "What is in this picture?", "images": [RED]}], sampling)
    # The picture's cells were kept: only the new message (and the reply's end) is prefilled.
    assert follow.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
    assert follow.usage.prompt_tokens - follow.usage.prompt_tokens_details.cached_tokens < 30


def test_ollamas_images_are_read_and_interleaved_conversations_keep_their_pictures(eyes_host):
    with running(eyes_host) as app:
        client = ollama.Client(host=app.base_url)
        options = {"temperature": 0, "num_predict": 8, "repeat_penalty": 1.0}
        red = client.chat(model=EYES, messages=[
            {"role": "user", "content": "Describe it.", "images": [RED]}], options=options)
        blue = client.chat(model=EYES, messages=[
            {"role": "user", "content": "Describe it.", "images": [BLUE]}], options=options)
        again = client.chat(model=EYES, messages=[
            {"role": "user", "content": "Describe it.", "images": [RED]},
            {"role": "assistant", "content": red.message.content},
            {"role": "user", "content": "Shorter."}], options=options)
    assert red.message.content and blue.message.content
    # Ollama's prompt_eval_count counts what was evaluated: the red picture was not again.
    assert again.prompt_eval_count < red.prompt_eval_count


def test_ollama_generate_reads_images_as_a_chat_reads_them(eyes_host, eyes_oracle):
    """``ollama.generate(prompt, images=...)``, as LLaVA's examples call it: the prompt goes
    through the chat template as a user message with its pictures, answered as a fresh prefill
    of that message answers it; raw prompts and token contexts have no pictures."""
    with running(eyes_host) as app:
        client = ollama.Client(host=app.base_url)
        options = {"temperature": 0, "num_predict": 12, "repeat_penalty": 1.0}
        reply = client.generate(model=EYES, prompt="What is in this picture?", images=[RED],
                                system="Answer briefly.", options=options)
        for extra in ({"raw": True}, {"suffix": ")"}, {"context": [1, 2]}):
            status, _, answer = raw(app, post("/api/generate", {
                "model": EYES, "prompt": "hi", "images": [base64.b64encode(RED).decode()],
                **extra}))
            assert status == 400 and "images" in json.loads(answer)["error"], extra
    sampling = replace(GREEDY, max_tokens=12)
    assert_text_matches_fresh(reply.response, eyes_oracle, [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is in this picture?", "images": [RED]}], sampling)


@pytest.mark.parametrize(("part", "param", "words"), [
    ({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
     "messages[0].content[1].image_url.url", "never fetches"),
    ({"type": "image_url", "image_url": {"url": "file:///etc/passwd"}},
     "messages[0].content[1].image_url.url", "a file: URL"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,not base64!"}},
     "messages[0].content[1].image_url.url", "not valid base64"),
    ({"type": "image_url", "image_url": {"url": data_url(RED[:60])}},
     "messages[0].content[1].image_url.url", "truncated"),
    ({"type": "image_url", "image_url": {"url": data_url(b"GIF89a" + b"\0" * 4)}},
     "messages[0].content[1].image_url.url", "GIF"),
    ({"type": "image_url", "image_url": {"url": data_url(b"RIFF\0\0\0\0WEBPVP8 ")}},
     "messages[0].content[1].image_url.url", "not an image localchat reads"),
])
def test_pictures_the_server_must_not_or_cannot_read_are_400s_naming_the_field(eyes_host, part,
                                                                              param, words):
    body = {"model": EYES, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"}, part]}]}
    with running(eyes_host) as app:
        status, _, answer = raw(app, post("/v1/chat/completions", body))
    error = json.loads(answer)["error"]
    assert status == 400 and error["param"] == param and words in error["message"], error


def test_a_model_without_a_projector_refuses_pictures_before_it_queues(serve_host):
    with running(serve_host) as app:
        status, _, answer = raw(app, post("/v1/chat/completions", {
            "model": MODEL, "messages": [asking("What is this?", RED)]}))
        error = json.loads(answer)["error"]
        assert status == 400 and f"{MODEL} does not read images" in error["message"]
        status, _, answer = raw(app, post("/api/chat", {"model": MODEL, "messages": [
            {"role": "user", "content": "hi", "images": [base64.b64encode(RED).decode()]}]}))
        assert status == 400 and "does not read images" in json.loads(answer)["error"]
        status, _, answer = raw(app, post("/api/generate", {
            "model": MODEL, "prompt": "hi", "images": [base64.b64encode(RED).decode()]}))
        assert status == 400 and "does not read images" in json.loads(answer)["error"]
        assert app.scheduler.served == 0


def test_pictures_belong_to_user_messages(eyes_host):
    with running(eyes_host) as app:
        status, _, answer = raw(app, post("/v1/chat/completions", {"model": EYES, "messages": [
            {"role": "system", "content": [{"type": "image_url",
                                            "image_url": {"url": data_url(RED)}}]},
            {"role": "user", "content": "hi"}]}))
    error = json.loads(answer)["error"]
    assert status == 400 and error["param"] == "messages[0].content"
