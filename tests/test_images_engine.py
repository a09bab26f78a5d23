"""Images in the engine's records (issue 47): a picture becomes placeholder cells keyed by its
SHA-256, so the exact-prefix reuse works across turns as for text. Real engine, the synthetic
``mlp`` projector (tests/projector_fixture.py), real PNG/GIF/JPEG bytes (tests/image_fixture.py).
"""

from __future__ import annotations

import contextlib
import time

import pytest
from image_fixture import gif, jpeg, png
from oracle import GREEDY, NEAR_TIE, assert_matches_fresh, loaded_engine, reply_tokens
from projector_fixture import write_mlp_projector

from localchat.context.chat_context import ChatContext
from localchat.engine.engine import Engine
from localchat.engine.image_records import image_safe_cut, placeholders
from localchat.engine.options import EngineOptions
from localchat.engine.slots.parallel import ParallelEngine
from localchat.engine.snapshot_file import SnapshotStore
from localchat.engine.vision import image_support
from localchat.events import Done, Failed, PrefillProgress

pytestmark = pytest.mark.skipif(not image_support().available, reason="no libmtmd in this build")

RED, BLUE = png(40, 30, (255, 0, 0)), png(40, 30, (0, 0, 255))


@pytest.fixture(scope="module")
def projector(tmp_path_factory):
    return write_mlp_projector(tmp_path_factory.mktemp("proj") / "mmproj.gguf")


@pytest.fixture(scope="module")
def vision_engine(test_model_path, projector):
    with loaded_engine(test_model_path, 1024, "vision", speculative="off", mmproj=projector) as engine:
        yield engine


@pytest.fixture(scope="module")
def vision_oracle(test_model_path, projector):
    """A second engine with the same projector: its cache is emptied before each answer."""
    with loaded_engine(test_model_path, 1024, "oracle", speculative="off", mmproj=projector) as engine:
        yield engine


@pytest.fixture
def engine(vision_engine):
    vision_engine.reset()
    return vision_engine


def ask(engine, messages) -> tuple[list[int], Done]:
    tokens, done = reply_tokens(engine.submit(messages, GREEDY))
    return tokens, done


def first_image_at(engine, messages) -> int:
    return next(i for i, t in enumerate(engine.fresh_prompt(messages)) if t < 0)


def test_a_picture_is_read_and_encoded_once_per_turn(engine):
    messages = [{"role": "user", "content": "What is in this picture?", "images": [RED]}]
    tokens, done = ask(engine, messages)
    assert done.finish_reason in ("stop", "length") and tokens
    assert done.timings.images_n == 1 and done.timings.image_ms > 0
    # The picture's 4 tokens (28-pixel tower, 14-pixel patches) are 4 placeholder cells.
    record = next(r for r in engine.cached_messages() if r.role == "user")
    assert sum(1 for t in record.tokens if t < 0) == 4


def test_second_question_about_the_same_picture_prefills_only_the_new_text(engine, vision_oracle):
    first = [{"role": "user", "content": "Describe this picture.", "images": [RED]}]
    reply, done1 = ask(engine, first)
    held = engine.tokens_in_context
    second = [*first, {"role": "assistant", "content": done1.reply},
              {"role": "user", "content": "And its colour?"}]
    tokens, done2 = ask(engine, second)
    assert done2.timings.images_n == 0
    assert done2.timings.cache_n >= held - 1
    new_text = engine.prompt_tokens(second) - done2.timings.cache_n
    assert done2.timings.prompt_n == new_text < 20
    assert_matches_fresh(tokens, vision_oracle, second)


def test_the_greedy_reply_with_a_picture_equals_a_fresh_prefill(engine, vision_oracle):
    messages = [{"role": "system", "content": "You describe pictures."},
                {"role": "user", "content": "What do you see?", "images": [BLUE, RED]}]
    tokens, _ = ask(engine, messages)
    assert_matches_fresh(tokens, vision_oracle, messages)


def test_a_different_picture_breaks_the_prefix_at_the_picture(engine):
    ask(engine, [{"role": "user", "content": "What is this?", "images": [RED]}])
    other = [{"role": "user", "content": "What is this?", "images": [BLUE]}]
    _, done = ask(engine, other)
    assert done.timings.cache_n == first_image_at(engine, other)
    assert done.timings.images_n == 1


def test_the_same_text_with_another_picture_is_another_message(engine):
    ask(engine, [{"role": "user", "content": "Look.", "images": [RED]}])
    records = engine.cached_messages()
    assert not any(r.matches({"role": "user", "content": "Look."}) for r in records)


def test_a_restored_snapshot_answers_without_encoding_again(engine, vision_oracle, tmp_path):
    first = [{"role": "user", "content": "What colour is it?", "images": [RED]}]
    _, done1 = ask(engine, first)
    store = SnapshotStore(tmp_path)
    store.save("s", engine.fingerprint(), engine.export_snapshot())
    engine.reset()
    saved = store.load("s", engine.fingerprint())
    engine.import_snapshot(saved.snapshot)
    second = [*first, {"role": "assistant", "content": done1.reply},
              {"role": "user", "content": "Are you sure?"}]
    tokens, done2 = ask(engine, second)
    assert done2.timings.images_n == 0 and done2.timings.cache_n >= saved.snapshot.n_tokens - 1
    assert_matches_fresh(tokens, vision_oracle, second)


def test_gif_and_jpeg_pictures_are_read(engine):
    animated = gif(20, 20, [(255, 0, 0), (0, 255, 0)])
    _, done = ask(engine, [{"role": "user", "content": "Two pictures.",
                            "images": [jpeg(24, 16, 200), animated]}])
    assert done.timings.images_n == 2


def test_a_model_without_projector_refuses_pictures_in_one_line(shared_engine):
    shared_engine.reset()
    events = list(shared_engine.submit([{"role": "user", "content": "hi", "images": [RED]}],
                                       GREEDY))
    assert isinstance(events[-1], Failed)
    assert "does not read images" in events[-1].message and "\n" not in events[-1].message


def test_too_many_image_tokens_for_the_context_are_refused_with_the_numbers(
        test_model_path, tmp_path):
    big = write_mlp_projector(tmp_path / "big.gguf", image_size=336)  # 576 tokens a picture
    with loaded_engine(test_model_path, 256, "small", speculative="off", mmproj=big) as engine:
        events = list(engine.submit([{"role": "user", "content": "hi", "images": [RED]}], GREEDY))
        assert isinstance(events[-1], Failed)
        assert "576 of them for its images" in events[-1].message
        assert "context holds 256" in events[-1].message
        assert engine.tokens_in_context == 0


@pytest.mark.parametrize("parallel", [1, 2])
def test_a_stop_while_a_picture_is_evaluated_ends_it_there_keeping_none_of_it(test_model_path,
                                                                              tmp_path, parallel):
    """Esc during a picture (or a client gone, in a parallel slot): its embeddings' decode
    (libmtmd's llama_decode calls, ~1 s for these 1,024 tokens here) is aborted mid-batch, not
    run to the picture's end."""
    big = write_mlp_projector(tmp_path / "big.gguf", image_size=448)  # 1,024 tokens a picture
    options = EngineOptions(n_ctx=2048, gpu_layers=0, speculative="off", mmproj=big,
                            parallel=parallel)
    engine = (ParallelEngine if parallel > 1 else Engine)(test_model_path, options, name="stopped")
    engine.load()
    with contextlib.closing(engine):
        handle = engine.submit([{"role": "user", "content": "hi", "images": [RED]}], GREEDY)
        events = []
        for event in handle:
            events.append(event)
            if isinstance(event, PrefillProgress):  # the text before the picture is in
                time.sleep(0.3)
                handle.stop()
        done = events[-1]
        assert isinstance(done, Done) and done.finish_reason == "aborted"
        assert done.timings.images_n == 0
        kv = engine._kv if parallel > 1 else engine._require_kv()
        assert kv.runtime.max_position() < 1024  # none of the picture's cells


def test_a_cut_inside_a_picture_moves_back_to_its_start():
    tokens = [1, 2, *placeholders("ab" * 32, 4), 3]
    assert [image_safe_cut(tokens, n) for n in range(8)] == [0, 1, 2, 2, 2, 2, 6, 7]


@pytest.mark.parametrize("mode", ["ngram", "draft"])
def test_drafting_goes_on_around_pictures_and_the_reply_is_the_same(test_model_path, projector,
                                                                     vision_oracle, mode,
                                                                     always_draft):
    """Prompt lookup never copies a picture's placeholders; the draft model (here the test
    model drafting for itself, without a projector) reads the text around the pictures. (The
    policy drafts wherever a drafter proposes: whether a draft pays is timed, and CI's load
    made it draft nothing.)"""
    draft = {"draft_model": str(test_model_path)} if mode == "draft" else {}
    with loaded_engine(test_model_path, 1024, "drafting", speculative=mode,
                       mmproj=projector, **draft) as drafting:
        first = [{"role": "user", "content": "Repeat: one two three one two three.",
                  "images": [RED]}]
        tokens, done1 = ask(drafting, first)
        assert_matches_fresh(tokens, vision_oracle, first)
        second = [*first, {"role": "assistant", "content": done1.reply},
                  {"role": "user", "content": "Again: one two three one two three.",
                   "images": [BLUE]}]
        tokens, done2 = ask(drafting, second)
        assert done2.timings.images_n == 1  # the new picture only
        assert done1.timings.draft_n + done2.timings.draft_n > 0
        assert done2.timings.draft_n_accepted > 0
        assert_matches_fresh(tokens, vision_oracle, second)


def settled_draft(chat, steps: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while chat.draft.steps < steps:
        assert time.monotonic() < deadline, "the draft's step did not finish"
        time.sleep(0.02)


def test_a_draft_with_a_picture_is_encoded_while_typed_and_the_reply_is_exact(engine,
                                                                               vision_oracle):
    """Prefill while typing with a picture attached: the picture alone first (no words yet),
    then the words; sending encodes nothing and evaluates the reply header only."""
    chat = ChatContext(engine, system="You are a helpful assistant.", sampling=GREEDY)
    chat.draft.update("", (RED,))
    settled_draft(chat, 1)
    assert chat.draft.step_timings[0].images_n == 1
    text = "What colour is this picture? Answer in one word."
    chat.draft.update(text, (RED,))
    settled_draft(chat, 2)
    assert chat.draft.cached_text == text and chat.draft.step_timings[1].images_n == 0
    chat.draft.update(text, (BLUE,))  # another picture: the draft starts over with it
    settled_draft(chat, 3)
    assert chat.draft.step_timings[2].images_n == 1
    tokens, done = reply_tokens(chat.send(text, images=(BLUE,)))
    assert done.timings.images_n == 0 and done.timings.prompt_n <= 5
    assert_matches_fresh(tokens, vision_oracle, chat.last_sent)


def test_preparing_a_message_with_a_picture_leaves_its_cells_for_the_turn(engine):
    messages = [{"role": "user", "content": "What is this?", "images": [RED]}]
    events = list(engine.prepare(messages))
    assert isinstance(events[-1], Done) and events[-1].timings.images_n == 1
    _, done = ask(engine, messages)
    assert done.timings.images_n == 0
    assert done.timings.cache_n >= first_image_at(engine, messages) + 4


def test_a_stop_during_prefill_keeps_no_part_of_a_picture(engine):
    long_text = "word " * 300
    messages = [{"role": "user", "content": long_text, "images": [RED]},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "again " * 200, "images": [BLUE]}]
    handle = engine.submit(messages, GREEDY)
    for event in handle:
        if type(event).__name__ == "PrefillProgress":
            handle.stop()
    for record in engine.cached_messages():
        images = [t for t in record.tokens if t < 0]
        assert len(images) % 4 == 0  # whole pictures only
    _, done = ask(engine, messages)  # and the next turn goes on from what was kept
    assert done.timings.cache_n > 0


def test_parallel_slots_read_pictures_beside_a_streaming_slot(test_model_path, projector,
                                                              vision_oracle):
    """An image's evaluation is a step of its own at the slots' gate: the picture reads as on
    one slot (the oracle), the other slot streams on, and the next question about the same
    picture encodes nothing again."""
    import threading

    from localchat.engine.options import EngineOptions
    from localchat.engine.slots.parallel import ParallelEngine

    engine = ParallelEngine(test_model_path, EngineOptions(n_ctx=1024, gpu_layers=0, parallel=2,
                                                           mmproj=projector), name="slots")
    engine.load()
    try:
        pictured = [{"role": "user", "content": "What is in this picture?", "images": [RED]}]
        plain = [{"role": "user", "content": "Count from one to ten."}]
        results: dict = {}

        def one(name, messages) -> None:
            results[name] = ask(engine, messages)

        threads = [threading.Thread(target=one, args=("picture", pictured)),
                   threading.Thread(target=one, args=("plain", plain))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        tokens, done = results["picture"]
        assert done.timings.images_n == 1
        assert_matches_fresh(tokens, vision_oracle, pictured)
        assert results["plain"][1].finish_reason in ("stop", "length")
        follow = [*pictured, {"role": "assistant", "content": done.reply},
                  {"role": "user", "content": "And its colour?"}]
        _, again = ask(engine, follow)
        assert again.timings.images_n == 0 and again.timings.prompt_n < 30
    finally:
        engine.close()


COLOUR_WORDS = {" red": (255, 0, 0), " green": (0, 255, 0), " blue": (0, 0, 255)}


@pytest.fixture(scope="module")
def colour_engine(test_model_path, tmp_path_factory):
    """An engine whose projector reads a solid red, green or blue picture as that word."""
    from projector_fixture import token_embeddings, write_colour_projector

    with loaded_engine(test_model_path, 1024, "colours", speculative="off") as text:
        ids = [text.tokenize(word)[0] for word in COLOUR_WORDS]
    projector = write_colour_projector(tmp_path_factory.mktemp("colours") / "colours.gguf",
                                       token_embeddings(test_model_path, ids))
    with loaded_engine(test_model_path, 1024, "colours", speculative="off",
                       mmproj=projector) as engine:
        yield engine, dict(zip(COLOUR_WORDS, ids))


@pytest.mark.parametrize("word", list(COLOUR_WORDS))
def test_a_solid_picture_reads_exactly_as_its_colour_words(colour_engine, word):
    import numpy as np

    from localchat.engine.fresh import fresh_logits

    engine, ids = colour_engine
    messages = [{"role": "user", "content": "Which colour is this?",
                 "images": [png(28, 28, COLOUR_WORDS[word])]}]
    prompt = engine.fresh_prompt(messages)
    as_words = [ids[word] if t < 0 else t for t in prompt]
    assert sum(1 for t in prompt if t < 0) == 4
    seen = engine.fresh_logits(messages, [])
    read = engine.with_cache(lambda kv: fresh_logits(kv, as_words, [], None, 128))
    # Measured: equal to the bit (the embeddings are the words' own, the batches the same).
    assert np.allclose(seen, read, rtol=0, atol=1e-4), float(np.max(np.abs(seen - read)))
    assert int(np.argmax(seen)) == int(np.argmax(read))


def test_a_picture_kept_in_the_cache_and_a_snapshot_reads_as_its_words(colour_engine):
    from localchat.engine.fresh import fresh_logits
    from localchat.engine.layout import RawPrompt

    engine, ids = colour_engine
    engine.reset()
    first = [{"role": "user", "content": "Name this colour.", "images": [png(28, 28, (0, 0, 255))]}]
    _, done1 = ask(engine, first)
    snapshot = engine.export_snapshot()
    second = [*first, {"role": "assistant", "content": done1.reply},
              {"role": "user", "content": "Say it again, twice."}]
    as_words = RawPrompt(tuple(ids[" blue"] if t < 0 else t for t in engine.fresh_prompt(second)))
    engine.reset()
    expected, _ = reply_tokens(engine.submit_prompt(as_words, GREEDY))
    for restore in (False, True):
        engine.reset()
        if restore:
            engine.import_snapshot(snapshot)
        else:
            ask(engine, first)
        tokens, done2 = ask(engine, second)
        assert done2.timings.images_n == 0 and done2.timings.cache_n > 0
        if tokens != expected:  # only a near-tie flipped by batch-shape rounding may differ
            i = next(k for k, (a, b) in enumerate(zip(tokens, expected)) if a != b)
            before = expected[:i]
            logits = engine.with_cache(
                lambda kv, before=before: fresh_logits(kv, list(as_words.tokens), before, None, 128))
            assert logits[expected[i]] - logits[tokens[i]] < NEAR_TIE
