"""The KV layout planner: which tokens a turn reuses, shifts or prefills (no model needed)."""

from __future__ import annotations

import pytest

from localchat.engine.layout import plan_layout
from localchat.engine.templates import NAMED_FORMATS, make_renderer

render = make_renderer(NAMED_FORMATS["chatml"], bos_token="", eos_token="<|im_end|>")


def tokenize(text: str, at_start: bool) -> list[int]:
    """One token per character: exact and easy to reason about."""
    return [ord(c) for c in text]


def sys_msg(text="Be brief."):
    return {"role": "system", "content": text}


def user(text):
    return {"role": "user", "content": text}


def assistant(text):
    return {"role": "assistant", "content": text}


def run_turn(cache, messages, reply, allow_shift=True):
    """Plan a turn, then 'generate' ``reply``: its tokens are evaluated into the open record."""
    layout = plan_layout(cache, messages, render, tokenize, allow_shift)
    open_record = layout.messages[-1]
    open_record.tokens += tokenize(reply, False)
    open_record.text += reply
    open_record.content = reply
    return layout


def test_first_turn_tokenizes_the_whole_prompt():
    messages = [sys_msg(), user("hi")]
    layout = plan_layout([], messages, render, tokenize)
    assert "".join(m.text for m in layout.messages) == render(messages, True)
    assert layout.tokens == tokenize(render(messages, True), True)
    assert layout.messages[-1].open and layout.messages[-1].text == "<|im_start|>assistant\n"
    assert layout.shift is None and not layout.prefix_fallback


def test_second_turn_prefills_only_end_marker_user_message_and_header():
    first = [sys_msg(), user("hi")]
    cache = run_turn([], first, "Hello!").messages
    cached_tokens = [t for m in cache for t in m.tokens]
    second = first + [assistant("Hello!"), user("more")]
    layout = plan_layout(cache, second, render, tokenize)
    assert layout.tokens[: len(cached_tokens)] == cached_tokens
    new = "".join(chr(t) for t in layout.tokens[len(cached_tokens):])
    assert new == "<|im_end|>\n<|im_start|>user\nmore<|im_end|>\n<|im_start|>assistant\n"
    assert "".join(m.text for m in layout.messages) == render(second, True)


def test_sampled_reply_tokens_are_kept_even_if_retokenizing_would_differ():
    first = [sys_msg(), user("hi")]
    layout = plan_layout([], first, render, tokenize)
    layout.messages[-1].tokens += [9001]  # one sampled token standing for "Hey"
    layout.messages[-1].text += "Hey"
    layout.messages[-1].content = "Hey"
    second = first + [assistant("Hey"), user("x")]
    after = plan_layout(layout.messages, second, render, tokenize)
    assert 9001 in after.tokens and not after.prefix_fallback


def test_trimmed_turns_are_removed_by_shift_and_kept_turns_are_not_retokenized():
    m = [sys_msg(), user("one")]
    cache = run_turn([], m, "1").messages
    m += [assistant("1"), user("two")]
    cache = run_turn(cache, m, "2").messages
    m += [assistant("2"), user("three")]
    sys_len = len(cache[0].tokens)
    dropped = len(cache[1].tokens) + len(cache[2].tokens)
    trimmed = [m[0]] + m[3:]
    layout = plan_layout(cache, trimmed, render, tokenize)
    assert layout.shift is not None
    assert (layout.shift.start, layout.shift.end) == (sys_len, sys_len + dropped)
    assert layout.messages[1] is cache[3]  # the kept user turn, same tokens object
    assert layout.continues
    assert "".join(x.text for x in layout.messages) == render(trimmed, True)


def test_a_summary_before_kept_turns_is_never_inserted_it_is_prefilled_from_there():
    m = [sys_msg(), user("one")]
    cache = run_turn([], m, "1").messages
    m += [assistant("1"), user("two")]
    cache = run_turn(cache, m, "2").messages
    m += [assistant("2"), user("three")]
    summary = [user("Summary: counted to one"), assistant("OK")]
    trimmed = [m[0]] + summary + m[3:]
    layout = plan_layout(cache, trimmed, render, tokenize)
    assert layout.shift is None and not layout.continues
    # The system prompt is reused; everything from the summary on is tokenized anew.
    assert layout.messages[0] is cache[0]
    assert all(x is not c for x in layout.messages[1:] for c in cache)
    assert "".join(x.text for x in layout.messages) == render(trimmed, True)


def test_dropping_a_summary_pair_and_old_turns_is_a_plain_shift():
    summary = [user("Summary: earlier"), assistant("OK")]
    m = [sys_msg()] + summary + [user("one")]
    cache = run_turn([], m, "1").messages
    m += [assistant("1"), user("two")]
    cache = run_turn(cache, m, "2").messages
    later = [m[0], m[5], assistant("2"), user("three")]  # summary pair and turn one dropped
    layout = plan_layout(cache, later, render, tokenize)
    assert layout.shift is not None and layout.continues
    assert layout.shift.start == len(cache[0].tokens)


def test_another_conversation_or_a_retry_does_not_continue_the_cache():
    m = [sys_msg(), user("one")]
    cache = run_turn([], m, "1").messages
    m += [assistant("1"), user("two")]
    cache = run_turn(cache, m, "2").messages
    retry = m[:4]  # the last reply taken back: same messages minus the reply
    assert not plan_layout(cache, retry, render, tokenize).continues
    assert not plan_layout(cache, [sys_msg(), user("fruits?")], render, tokenize).continues
    assert plan_layout(cache, m + [assistant("2"), user("3")], render, tokenize).continues


def test_no_shift_when_the_memory_cannot_shift():
    m = [sys_msg(), user("one")]
    cache = run_turn([], m, "1").messages
    m += [assistant("1"), user("two")]
    cache = run_turn(cache, m, "2").messages
    layout = plan_layout(cache, [m[0]] + m[3:] + [assistant("2"), user("3")], render, tokenize,
                         allow_shift=False)
    assert layout.shift is None


def test_changed_system_prompt_is_not_shifted_but_reprefilled():
    m = [sys_msg("A"), user("one")]
    cache = run_turn([], m, "1").messages
    changed = [sys_msg("B"), user("one"), assistant("1"), user("two")]
    layout = plan_layout(cache, changed, render, tokenize)
    assert layout.shift is None and not layout.continues
    assert layout.tokens[: len(cache[0].tokens)] != cache[0].tokens


def test_a_system_prompt_added_before_cached_turns_is_not_rotated_in():
    m = [user("one")]
    cache = run_turn([], m, "1").messages
    added = [sys_msg("Pirate."), user("one"), assistant("1"), user("two")]
    layout = plan_layout(cache, added, render, tokenize)
    assert layout.shift is None and not layout.continues


def test_template_that_rewrites_earlier_turns_falls_back_and_says_so():
    # Drops the content of all but the last assistant message (like templates that strip reasoning).
    rewriting = make_renderer(
        "{% for m in messages %}<|{{ m['role'] }}|>"
        "{% if m['role'] == 'assistant' and not loop.last %}[…]{% else %}{{ m['content'] }}{% endif %}"
        "\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}",
        "", "",
    )
    m = [user("one")]
    layout = plan_layout([], m, rewriting, tokenize)
    layout.messages[-1].tokens += tokenize("1 long answer", False)
    layout.messages[-1].text += "1 long answer"
    layout.messages[-1].content = "1 long answer"
    m += [assistant("1 long answer"), user("two")]
    after = plan_layout(layout.messages, m, rewriting, tokenize)
    assert after.prefix_fallback
    assert "".join(x.text for x in after.messages) == rewriting(m, True)


@pytest.mark.parametrize("n_turns", [1, 3, 8])
def test_layout_text_always_equals_the_rendered_prompt(n_turns):
    m, cache = [sys_msg()], []
    for i in range(n_turns):
        m.append(user(f"question {i}"))
        layout = run_turn(cache, m, f"answer {i}")
        cache = layout.messages
        m.append(assistant(f"answer {i}"))
    final = plan_layout(cache, m + [user("last")], render, tokenize)
    assert "".join(x.text for x in final.messages) == render(m + [user("last")], True)
