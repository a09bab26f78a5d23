"""Decoding OpenAI-compatible server-sent events."""

from __future__ import annotations

import json

import pytest

from localchat.remote.sse import (
    RemoteStreamError,
    StreamTooLarge,
    Usage,
    decode_chunk,
    iter_lines,
    iter_sse_data,
)


def test_events_are_split_on_blank_lines_and_comments_and_other_fields_ignored():
    lines = [": keep-alive", "event: message", "data: one", "", "id: 7", "data: two", "data: lines",
             "", "retry: 100", "data:three", ""]
    assert list(iter_sse_data(lines)) == ["one", "two\nlines", "three"]


def test_carriage_returns_are_tolerated():
    assert list(iter_sse_data(["data: x\r", "\r"])) == ["x"]


def test_an_event_cut_off_by_the_end_of_the_stream_is_still_delivered():
    assert list(iter_sse_data(["data: last"])) == ["last"]


def test_content_delta_and_finish_reason():
    chunk = decode_chunk(json.dumps({"model": "m", "choices": [
        {"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]}))
    assert (chunk.content, chunk.finish_reason, chunk.model) == ("Hi", None, "m")
    end = decode_chunk(json.dumps({"choices": [{"delta": {}, "finish_reason": "length"}]}))
    assert (end.content, end.finish_reason) == ("", "length")


def test_content_given_as_parts_or_as_a_whole_message_is_read_and_other_shapes_carry_none():
    parts = decode_chunk(json.dumps({"choices": [{"delta": {"content": [
        {"type": "text", "text": "Hel"}, {"type": "image_url"}, {"type": "text", "text": "lo"}]}}]}))
    assert (parts.content, parts.chat) == ("Hello", True)
    whole = decode_chunk(json.dumps({"choices": [{"message": {"content": "Hi"}, "finish_reason": "stop"}]}))
    assert (whole.content, whole.finish_reason) == ("Hi", "stop")
    for odd in ({"choices": "Hi"}, {"choices": [{"delta": {"content": 7}}]}, {"text": "Hi"}):
        assert decode_chunk(json.dumps(odd)).content == ""
    assert not decode_chunk(json.dumps({"text": "Hi"})).chat


def test_the_usage_chunk_has_no_choices():
    chunk = decode_chunk(json.dumps({"choices": [], "usage": {"prompt_tokens": 12,
                                                              "completion_tokens": 5}}))
    assert chunk.content == "" and chunk.usage == Usage(12, 5)


def test_done_sentinel():
    assert decode_chunk("[DONE]").done


@pytest.mark.parametrize("payload, fragment", [
    (json.dumps({"error": {"message": "model overloaded", "type": "server_error"}}),
     "remote error: model overloaded"),
    (json.dumps({"error": "plain string error"}), "remote error: plain string error"),
    ('{"choices": [', "malformed"),
    ("[1, 2]", "malformed"),
])
def test_errors_and_garbage_are_one_line_stream_errors(payload, fragment):
    with pytest.raises(RemoteStreamError) as excinfo:
        decode_chunk(payload)
    assert fragment in str(excinfo.value) and "\n" not in str(excinfo.value)


def test_lines_end_at_cr_lf_or_crlf_even_split_across_chunks():
    chunks = [b"data: a\r", b"\ndata: b\rdata: c\n\n", "data: \u00e9".encode()[:-1],
              "data: \u00e9".encode()[-1:], b"\r\n"]
    assert list(iter_lines(chunks)) == ["data: a", "data: b", "data: c", "", "data: \u00e9"]


def test_a_line_or_an_event_over_the_cap_fails_before_the_rest_is_read():
    sent = []

    def endless():
        while True:
            sent.append(1)
            yield b"x" * 1000

    with pytest.raises(StreamTooLarge, match="a line over"):
        list(iter_lines(endless(), max_bytes=10_000))
    assert len(sent) == 11
    with pytest.raises(StreamTooLarge, match="an event over"):
        list(iter_sse_data(["data: " + "y" * 6000] * 2, max_bytes=10_000))
