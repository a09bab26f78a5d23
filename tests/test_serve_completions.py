"""``localchat serve``'s completions through the clients editors and apps run: OpenAI's
``/v1/completions`` (the ``openai`` SDK), llama-server's ``/infill`` (as llama.vim sends it) and
Ollama's ``/api/generate`` (the ``ollama`` library), on real servers over the real test model and
over a copy of it with fill-in-the-middle tokens in its metadata (tests/fim_model.py). The exact
cache behind them: a prompt that extends the previous one prefills only its new tokens, and the
greedy reply equals a fresh prefill's (tests/oracle.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import httpx
import ollama
import openai
import pytest
from fim_model import FIM_IDS, with_fim_tokens
from oracle import GREEDY, assert_text_matches_fresh, loaded_engine
from serve_fixtures import MODEL, running, serving

from localchat.engine.layout import RawPrompt
from localchat.events import Token
from localchat.serve.prompt_tokens import InfillPrompt, TextPrompt

pytestmark = pytest.mark.model

FIM_MODEL = "smollm2-fim"
EXACT = {"temperature": 0, "max_tokens": GREEDY.max_tokens, "extra_body": {"repeat_penalty": 1.0}}
OLLAMA_EXACT = {"temperature": 0, "num_predict": GREEDY.max_tokens, "repeat_penalty": 1.0}


@pytest.fixture(scope="module")
def server(serve_host):
    with running(serve_host) as app:
        yield app


@pytest.fixture(scope="module")
def fim_path(test_model_path):
    return with_fim_tokens(test_model_path, test_model_path.parent / "fim")


@pytest.fixture(scope="module")
def fim_server(fim_path):
    with serving(fim_path, FIM_MODEL) as app:
        yield app


@pytest.fixture(scope="module")
def fim_oracle(fim_path):
    """The exactness oracle for the FIM model (its own vocabulary lays the prompts)."""
    with loaded_engine(fim_path, 1024, "fim-oracle", speculative="off") as engine:
        yield engine


def openai_client(app) -> openai.OpenAI:
    return openai.OpenAI(base_url=app.base_url + "/v1", api_key="any", max_retries=0)


@pytest.fixture
def client(server):
    return openai_client(server)


def text_prompt(engine, text: str) -> RawPrompt:
    return TextPrompt(text=text).build(engine, MODEL)


# -- /v1/completions ---------------------------------------------------------------------------

def test_openai_sdk_completes_a_prompt_whole_and_streamed(client, fresh):
    prompt = "The three primary colours are"

    whole = client.completions.create(model=MODEL, prompt=prompt, **EXACT)
    chunks = list(client.completions.create(model=MODEL, prompt=prompt, stream=True,
                                            stream_options={"include_usage": True}, **EXACT))

    choice = whole.choices[0]
    assert whole.object == "text_completion" and choice.finish_reason in ("stop", "length")
    assert_text_matches_fresh(choice.text, fresh, text_prompt(fresh, prompt))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert_text_matches_fresh(streamed, fresh, text_prompt(fresh, prompt))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # The same prompt again: all of it but its last token came from the cache.
    usage = chunks[-1].usage
    assert usage.prompt_tokens == whole.usage.prompt_tokens == len(text_prompt(fresh, prompt).tokens)
    assert usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].model_extra["timings"]["prompt_n"] == 1


def test_a_completion_is_the_models_text_to_the_first_character(client, fresh):
    """A completion starts where the model starts: the newline and indentation before its first
    word are code, not space between reasoning and an answer (a chat's reply drops those)."""
    prompt = "def add(a, b):"
    whole = client.completions.create(model=MODEL, prompt=prompt, **EXACT)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt=prompt, stream=True, **EXACT) if c.choices)
    fresh.reset()
    tokens = [e.token_id for e in fresh.submit_prompt(text_prompt(fresh, prompt), GREEDY)
              if isinstance(e, Token)]
    runtime = fresh._require_runtime()
    written = b"".join(runtime.piece(t) for t in tokens).decode("utf-8", errors="replace")
    assert written[:1].isspace()  # the test model's greedy continuation: a newline, then code
    assert whole.choices[0].text == streamed == written


def test_typing_a_prompt_prefills_only_the_new_tokens(client, fresh):
    """An editor completing as the user types: each prompt is the last one and a few more
    characters. Only the tokens that differ from the last prompt are prefilled (the cache keeps
    the rest, even with the last reply after it), and the reply is a fresh prefill's."""
    typed = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    if n < 2"
    stops = [len(typed) - 12, len(typed) - 9, len(typed) - 6, len(typed) - 3, len(typed)]
    before: tuple[int, ...] = ()
    for i, end in enumerate(stops):
        prompt = typed[:end]
        tokens = text_prompt(fresh, prompt).tokens
        reply = client.completions.create(model=MODEL, prompt=prompt, **EXACT)
        timings = reply.model_extra["timings"]
        assert timings["cache_n"] + timings["prompt_n"] == len(tokens)
        if i:
            common = next((k for k, (a, b) in enumerate(zip(tokens, before)) if a != b),
                          min(len(tokens), len(before)))
            new = len(tokens) - common
            assert 1 <= timings["prompt_n"] <= max(1, new) <= 3, (prompt, timings)
        before = tokens
    assert_text_matches_fresh(reply.choices[0].text, fresh, text_prompt(fresh, typed))


def test_a_prompt_of_token_ids_is_completed_as_its_text(client, fresh):
    tokens = list(text_prompt(fresh, "Once upon a time").tokens)

    by_text = client.completions.create(model=MODEL, prompt="Once upon a time", **EXACT)
    by_ids = client.completions.create(model=MODEL, prompt=tokens, **EXACT)

    # The same prompt either way: each reply is the fresh prefill's (a near-tie aside: the
    # second re-reads the last token in a batch of its own).
    for reply in (by_text, by_ids):
        assert_text_matches_fresh(reply.choices[0].text, fresh, text_prompt(fresh, "Once upon a time"))
    assert by_ids.usage.prompt_tokens == len(tokens)


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"prompt": [1, 49152, 5]}, "prompt[1]", ["49152", "vocabulary of 49152 tokens"]),
    ({"prompt": "x", "n": 1000}, "n", ["must be 1"]),
    ({"prompt": "x", "echo": True}, "echo", ["echo is not supported"]),
    ({"prompt": ["a", "b"]}, "prompt", ["2 prompts"]),
    ({"prompt": "def f(", "suffix": "return 1"}, "suffix",
     [f"model {MODEL!r} has no fill-in-the-middle tokens"]),
    ({"prompt": "hello " * 1100}, "prompt", ["context of 1024 tokens"]),
    ({"prompt": [1, True]}, "prompt[1]", ["token id"]),
])
def test_completions_a_model_cannot_honour_are_400s_naming_the_field(client, fields, param, words):
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, **{"max_tokens": 4, **fields})

    error = caught.value.body
    assert caught.value.status_code == 400 and error["param"] == param
    assert all(word in error["message"] for word in words), error["message"]


def test_a_suffix_fills_the_gap_with_the_models_fim_tokens(fim_server, fim_oracle):
    client = openai_client(fim_server)

    reply = client.completions.create(model=FIM_MODEL, prompt="def add(a, b):\n    ",
                                      suffix="\n\nprint(add(1, 2))\n", **EXACT)

    gap = TextPrompt(text="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))\n")
    prompt = gap.build(fim_oracle, FIM_MODEL)
    assert prompt.tokens[0] == FIM_IDS["pre"] and prompt.tokens[-1] == FIM_IDS["mid"]
    assert reply.usage.prompt_tokens == len(prompt.tokens)
    assert_text_matches_fresh(reply.choices[0].text, fim_oracle, prompt)


# -- /infill -----------------------------------------------------------------------------------

def test_infill_lays_extra_chunks_then_the_gap_as_llama_server(fim_oracle):
    vocabulary = fim_oracle.vocabulary

    def text(value: str) -> list[int]:
        return vocabulary.tokenize(value, special=False)

    infill = InfillPrompt("def add(a, b):\n", "\nprint(add(1, 2))\n",
                          (("util.py", "import os\n"),), "    ret")

    tokens = list(infill.build(fim_oracle, FIM_MODEL).tokens)

    ids = FIM_IDS
    assert tokens == [ids["rep"], *text("myproject\n"), ids["sep"], *text("util.py\n"),
                      *text("import os\n"), ids["sep"], *text("filename\n"), ids["pre"],
                      *text("def add(a, b):\n"), *vocabulary.tokenize("    ret", special=True),
                      ids["suf"], *text("\nprint(add(1, 2))\n"), ids["mid"]]


def test_infill_keeps_only_the_budget_of_a_long_prefix_and_suffix(fim_oracle):
    """llama-server's budget: the prefix's last 3/4 batch, the suffix's first quarter less
    the prompt (n_batch 512 here: 384 and 128 - 2)."""
    n_batch = fim_oracle.options.n_batch
    infill = InfillPrompt("x = 1\n" * 400, "y = 2\n" * 400)

    tokens = list(infill.build(fim_oracle, FIM_MODEL).tokens)

    pre, suf = tokens.index(FIM_IDS["pre"]), tokens.index(FIM_IDS["suf"])
    assert suf - pre - 1 == 3 * (n_batch // 4)
    assert len(tokens) - suf - 2 == n_batch // 4 - 2


def test_infill_answers_as_llama_server_and_keeps_the_extra_chunks_cached(fim_server, fim_oracle):
    body = {"input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}],
            "input_prefix": "def add(a, b):\n", "input_suffix": "\n\nprint(add(1, 2))\n",
            "prompt": "    re", "temperature": 0, "repeat_penalty": 1.0,
            "n_predict": GREEDY.max_tokens, "samplers": ["top_k"], "cache_prompt": True}
    url = fim_server.base_url + "/infill"

    whole = httpx.post(url, json=body, timeout=60).json()
    typed = httpx.post(url, json={**body, "prompt": "    ret"}, timeout=60).json()
    with httpx.stream("POST", url, json={**body, "prompt": "    ret", "stream": True},
                      timeout=60) as streamed:
        events = [line.removeprefix("data: ") for line in streamed.iter_lines() if line]
    warmed = httpx.post(url, json={**body, "prompt": "    retu", "n_predict": 0}, timeout=60).json()

    prompt = InfillPrompt(body["input_prefix"], body["input_suffix"],
                          (("util.py", body["input_extra"][0]["text"]),), "    re")
    assert whole["stop"] is True and whole["stop_type"] in ("eos", "limit")
    assert_text_matches_fresh(whole["content"], fim_oracle, prompt.build(fim_oracle, FIM_MODEL))
    # One more character typed: the extra chunks and the prefix stayed cached; only what
    # follows the first token that changed is prefilled (the prompt's end, suffix, middle).
    first = prompt.build(fim_oracle, FIM_MODEL).tokens
    again = replace(prompt, prompt="    ret").build(fim_oracle, FIM_MODEL).tokens
    common = next(k for k, (a, b) in enumerate(zip(first, again)) if a != b)
    assert common > first.index(FIM_IDS["pre"])
    assert typed["tokens_cached"] == common and typed["timings"]["prompt_n"] == len(again) - common
    chunks = [json.loads(event) for event in events]
    assert [c["stop"] for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert_text_matches_fresh("".join(c["content"] for c in chunks), fim_oracle,
                              replace(prompt, prompt="    ret").build(fim_oracle, FIM_MODEL))
    assert 0 < chunks[-1]["timings"]["predicted_n"] <= GREEDY.max_tokens
    # n_predict 0 (llama.vim warming the cache): prefilled, nothing said.
    assert warmed["content"] == "" and warmed["tokens_predicted"] == 0


def test_infill_on_a_model_without_fim_tokens_is_a_400_naming_it(server):
    answer = httpx.post(server.base_url + "/infill", timeout=30,
                        json={"input_prefix": "def f(", "input_suffix": ")"})

    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "model" and MODEL in error["message"]


# -- /api/generate -----------------------------------------------------------------------------

def test_ollama_generate_templated_raw_and_continued_from_its_context(server, fresh):
    client = ollama.Client(host=server.base_url)
    system, question = "You are terse.", "Name a fruit."

    templated = client.generate(model=MODEL, prompt=question, system=system, options=OLLAMA_EXACT)
    raw = client.generate(model=MODEL, prompt="The sky is", raw=True, options=OLLAMA_EXACT)
    parts = list(client.generate(model=MODEL, prompt=" And the sea is", raw=True,
                                 context=raw.context, options=OLLAMA_EXACT, stream=True))

    messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
    assert templated.done and templated.response
    assert_text_matches_fresh(templated.response, fresh, messages)
    assert_text_matches_fresh(raw.response, fresh, text_prompt(fresh, "The sky is"))
    # The context is the prompt and the reply: the next prompt goes on after them, and only its
    # own tokens are evaluated (and the reply's last token, if the limit cut it).
    sky = text_prompt(fresh, "The sky is").tokens
    assert raw.context[:len(sky)] == list(sky) and len(raw.context) == len(sky) + raw.eval_count
    sea = fresh.vocabulary.tokenize(" And the sea is", special=True)
    last = parts[-1]
    assert last.done and not any(p.done for p in parts[:-1]) and last.context[:len(raw.context)] == raw.context
    assert len(sea) <= last.prompt_eval_count <= len(sea) + 1
    continued = RawPrompt((*raw.context, *sea))
    assert_text_matches_fresh("".join(p.response for p in parts), fresh, continued)


def test_ollama_generate_fills_a_gap_with_a_suffix(fim_server, fim_oracle):
    client = ollama.Client(host=fim_server.base_url)

    reply = client.generate(model=FIM_MODEL, prompt="def add(a, b):\n    ",
                            suffix="\n\nprint(add(1, 2))\n", options=OLLAMA_EXACT)

    gap = TextPrompt(text="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))\n")
    assert_text_matches_fresh(reply.response, fim_oracle, gap.build(fim_oracle, FIM_MODEL))


def test_ollama_generate_with_nothing_to_complete_only_loads(server):
    reply = ollama.Client(host=server.base_url).generate(model=MODEL)

    assert reply.done and reply.done_reason == "load" and reply.response == ""


@pytest.mark.parametrize(("fields", "words"), [
    ({"suffix": ")"}, [f"model {MODEL!r} has no fill-in-the-middle tokens"]),
    ({"images": ["aGVsbG8="]}, ["images"]),
    ({"template": "{{ .Prompt }}"}, ["template"]),
    ({"context": [3, 49152]}, ["context[1]", "vocabulary of 49152 tokens"]),
    ({"context": "abc"}, ["context must be an array of token ids"]),
])
def test_ollama_generate_refusals_are_400s_naming_the_field(server, fields, words):
    answer = httpx.post(server.base_url + "/api/generate", timeout=30,
                        json={"model": MODEL, "prompt": "def f(", "stream": False, **fields})

    assert answer.status_code == 400
    assert all(word in answer.json()["error"] for word in words), answer.json()
