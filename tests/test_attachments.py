"""Files attached to a message: ``/file`` and ``@path`` in the app (a chip with the token count,
Tab completion), ``ask -f``; binaries and files too long for the context are refused with the
numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_engine import SIZE, FakeEngine, make_app, notices, ready, reply_finished, send, wait_until

from localchat.attachments import (
    FileReads,
    complete_path,
    mentioned_files,
    outgoing_message,
    read_attachment,
    with_attachments,
)
from localchat.errors import UserError


@pytest.fixture
def notes(tmp_path) -> Path:
    path = tmp_path / "notes.md"
    path.write_text("The launch is on Tuesday.\n")
    return path


def words(text: str) -> int:
    return len(text.split())


def test_a_text_file_goes_in_as_a_fenced_block_under_its_name(notes):
    attachment = read_attachment(str(notes), words, 100)
    assert (attachment.tokens, attachment.chip) == (5, "notes.md · 5 tokens")
    assert with_attachments("When?", [attachment]) == "File `notes.md`:\n```md\nThe launch is on Tuesday.\n```\n\nWhen?"


def test_binaries_other_encodings_and_long_files_are_refused_with_the_numbers(tmp_path):
    binary = tmp_path / "a.bin"
    binary.write_bytes(b"\x7fELF\0\0\1")
    latin = tmp_path / "latin.txt"
    # Not "café" alone: a last byte \xe9 is also how a UTF-8 file cut inside a character ends,
    # and that one is read up to it (test_faults.py, issue 38).
    latin.write_bytes("café au lait".encode("latin-1"))
    long = tmp_path / "long.txt"
    long.write_text("word " * 500)
    with pytest.raises(UserError, match="a.bin looks binary"):
        read_attachment(str(binary), words, 100)
    with pytest.raises(UserError, match="not UTF-8 text"):
        read_attachment(str(latin), words, 100)
    with pytest.raises(UserError, match="long.txt is 500 tokens; a message can hold at most 100"):
        read_attachment(str(long), words, 100)
    with pytest.raises(UserError, match="No file"):
        read_attachment(str(tmp_path / "nope.txt"), words, 100)


def test_at_mentions_and_path_completion(notes, monkeypatch):
    monkeypatch.chdir(notes.parent)
    assert mentioned_files("see @notes.md, and @nobody or a@b") == ["notes.md"]
    assert complete_path("no") == ["notes.md"]


def test_the_message_as_sent_has_each_file_once_and_files_share_the_room(notes, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text("one two three four\n")
    attached = [read_attachment(str(notes), words, 100)]
    # /file notes.md, then a mention of it and of another file: notes.md goes once, first.
    sent = outgoing_message("Compare @notes.md with @other.txt", attached, tmp_path, count_tokens=words, room=100)
    assert sent == with_attachments("Compare @notes.md with @other.txt",
                                    [attached[0], read_attachment(str(other), words, 100)])
    assert outgoing_message("hi", [], tmp_path, files=["other.txt"]) == with_attachments(
        "hi", [read_attachment(str(other), None, None)])
    with pytest.raises(UserError, match="other.txt is 4 tokens; a message can hold at most 3"):  # 5 of 8 taken
        outgoing_message("see @other.txt", attached, tmp_path, count_tokens=words, room=8)


def test_a_draft_reads_a_mentioned_file_again_only_when_it_changed_and_enter_always_does(notes, tmp_path):
    counted: list[str] = []

    def counting(text: str) -> int:
        counted.append(text)
        return words(text)

    reads = FileReads()

    def draft() -> str:
        return outgoing_message("see @notes.md", [], tmp_path, count_tokens=counting, room=100,
                                read=reads.read)

    first = draft()
    assert draft() == first and len(counted) == 1  # the second hand-over reused the read
    notes.write_text("The launch is on Wednesday, not Tuesday.\n")  # another size
    assert "Wednesday" in draft() and len(counted) == 2
    with pytest.raises(UserError, match="notes.md is 7 tokens; a message can hold at most 5"):
        outgoing_message("see @notes.md", [], tmp_path, count_tokens=counting, room=5, read=reads.read)
    assert len(counted) == 2  # a cached file still gets the room check
    sent = outgoing_message("see @notes.md", [], tmp_path, count_tokens=counting, room=100)
    assert sent == draft() and len(counted) == 3  # Enter reads the file itself


async def test_a_message_mentioning_a_file_is_prefilled_with_it_as_it_will_be_sent(store, notes, monkeypatch):
    monkeypatch.chdir(notes.parent)
    engine = FakeEngine(reply="Tuesday.")
    app = make_app(store, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.prompt.text = "When is the launch? The plan is in @notes.md"  # a paste: prefilled at once
        await wait_until(pilot, lambda: engine.prepared, "a draft step")
        await pilot.press("enter")
        await reply_finished(pilot)
    sent = engine.submitted[-1][-1]
    assert "The launch is on Tuesday." in sent["content"]
    assert engine.prepared[-1][-1] == sent  # what was prefilled is what was sent


async def test_file_attaches_with_a_chip_and_goes_with_the_next_message(store, notes):
    engine = FakeEngine(reply="Tuesday.")
    app = make_app(store, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, f"/file {notes}")
        chips = app.query_one("#attachments")
        await wait_until(pilot, lambda: chips.display, "the chip")
        assert f"notes.md · {engine.count_tokens(notes.read_text())} tokens" in str(chips.content)
        await send(pilot, "When is the launch?")
        await reply_finished(pilot)
        assert not chips.display
        await pilot.press("up")
        assert app.prompt.text == "When is the launch?"  # history holds what was typed
    sent = engine.submitted[-1][-1]["content"]
    assert sent.startswith("File `notes.md`:\n```md\nThe launch is on Tuesday.") and sent.endswith("When is the launch?")


async def test_an_at_path_attaches_the_file_and_tab_completes_it(store, notes, monkeypatch):
    monkeypatch.chdir(notes.parent)
    engine = FakeEngine(reply="ok")
    app = make_app(store, engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.prompt.text = "summarise @no"
        await pilot.press("tab")
        assert app.prompt.text == "summarise @notes.md"
        await pilot.press("enter")
        await reply_finished(pilot)
        await send(pilot, f"/file {notes.parent / 'missing.txt'}")
        await wait_until(pilot, lambda: any("No file" in n for n in notices(app)), "the refusal")
    assert "The launch is on Tuesday." in engine.submitted[-1][-1]["content"]


def test_ask_f_attaches_a_file_and_refuses_a_binary_in_one_line(test_model_path, notes, tmp_path, capsys):
    from localchat.cli import main

    binary = tmp_path / "a.bin"
    binary.write_bytes(b"\0\1\2")
    assert main(["ask", "-m", str(test_model_path), "-f", str(binary), "hi"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("localchat: error: a.bin looks binary") and err.count("\n") == 1
    code = main(["ask", "-m", str(test_model_path), "--temperature", "0", "--max-tokens", "4", "--json",
                 "-f", str(notes), "When is the launch?"])
    assert code == 0 and '"event": "done"' in capsys.readouterr().out
