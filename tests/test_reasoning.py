"""Telling a reasoning model's thinking apart from its answer, in any chunking of the stream."""

from __future__ import annotations

import itertools

import pytest

from localchat.reply.reasoning import (
    ReasoningSplitter,
    join_reply,
    prompt_opens_thinking,
    split_reply,
    strip_reasoning,
)

REPLY = "<think>\nThe user wants 2+2.\nThat is 4.\n</think>\n\nThe answer is **4**."


def run(pieces: list[str], inside: bool = False) -> tuple[str, str]:
    splitter = ReasoningSplitter(inside=inside)
    thinking, answer = [], []
    for piece in pieces:
        t, a = splitter.feed(piece)
        thinking.append(t)
        answer.append(a)
    t, a = splitter.flush()
    return "".join(thinking) + t, "".join(answer) + a


def chunkings(text: str, cuts: int):
    """Every way to cut ``text`` into ``cuts + 1`` pieces (tags split anywhere)."""
    for points in itertools.combinations(range(1, len(text)), cuts):
        bounds = (0, *points, len(text))
        yield [text[a:b] for a, b in zip(bounds, bounds[1:])]


def test_think_block_is_split_from_the_answer_however_the_stream_is_cut():
    expected = ("The user wants 2+2.\nThat is 4.\n", "The answer is **4**.")
    for pieces in chunkings(REPLY, 2):
        assert run(pieces) == expected, pieces


def test_a_block_the_prompt_opened_starts_as_reasoning():
    text = "Hmm, 2+2.\n</think>\n\nIt is 4."
    for pieces in chunkings(text, 2):
        assert run(pieces, inside=True) == ("Hmm, 2+2.\n", "It is 4."), pieces


def test_a_reply_without_reasoning_is_all_answer_and_a_later_tag_is_left_alone():
    assert run(["Use ", "<think>", " tags like this."]) == ("", "Use <think> tags like this.")
    assert run(["<b>bold</b>"]) == ("", "<b>bold</b>")


def test_nothing_is_released_while_the_start_could_still_be_a_tag():
    splitter = ReasoningSplitter()
    assert splitter.feed("  <thi") == ("", "")
    assert splitter.feed("nk>x") == ("x", "")
    assert splitter.thinking


def test_unclosed_reasoning_stays_reasoning_at_the_end():
    assert run(["<think>still going"]) == ("still going", "")
    assert run(["still going </thi"], inside=True) == ("still going </thi", "")


def test_prompt_opens_thinking_reads_the_generation_prompt():
    assert prompt_opens_thinking("<|im_start|>assistant\n<think>\n")
    assert not prompt_opens_thinking("<|im_start|>assistant\n<think>\n\n</think>\n\n")  # switched off
    assert not prompt_opens_thinking("<|im_start|>assistant\n")


@pytest.mark.parametrize("stored, expected", [
    (REPLY, ("The user wants 2+2.\nThat is 4.", "The answer is **4**.")),
    ("Hmm.\n</think>\n\nIt is 4.", ("Hmm.", "It is 4.")),  # the template opened the block
    ("Plain answer.", ("", "Plain answer.")),
    ("Say <think> and </think> literally.", ("", "Say <think> and </think> literally.")),
])
def test_split_reply_parts_a_stored_reply(stored, expected):
    assert split_reply(stored) == expected


def test_join_reply_round_trips_through_split_reply():
    joined = join_reply("weighing options", "Take the train.")
    assert split_reply(joined) == ("weighing options", "Take the train.")
    assert join_reply("", "Just this.") == "Just this."
    assert strip_reasoning(joined) == "Take the train."
