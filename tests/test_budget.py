"""The context budget policy: exact token arithmetic, no model.

Numbers in the tests are chosen so the arithmetic can be checked by hand; the comments show it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from localchat.context.budget import (
    ContextLayout,
    ContextSettings,
    SummaryRequest,
    TurnPlan,
    TurnSpan,
    plan_turn,
    should_prepare_summary,
)
from localchat.context.oversized_message import head_tail_cut, marker_text, overlong_message
from localchat.remote.context import select_for_remote


def turns(*sizes: int, first: int = 0) -> tuple[TurnSpan, ...]:
    return tuple(TurnSpan(first + i, size) for i, size in enumerate(sizes))


# n_ctx 1000, reply 200: prompts may use 800; a trim frees 250 beyond this turn's needs.
SETTINGS = ContextSettings(n_ctx=1000, reply_reserve=200, trim_fraction=0.25, summary_max_tokens=100)


# --- settings ---------------------------------------------------------------------------------


def test_settings_reject_a_reply_reserve_that_leaves_no_room_for_a_prompt():
    with pytest.raises(ValueError, match="reply_reserve"):
        ContextSettings(n_ctx=512, reply_reserve=512)


def test_for_reply_caps_the_reserve_at_half_the_context():
    assert ContextSettings.for_reply(1024, 4096).reply_reserve == 512
    assert ContextSettings.for_reply(1024, 128).reply_reserve == 128


def test_trim_margin_rounds_up_so_at_least_the_fraction_is_freed():
    assert ContextSettings(n_ctx=1001, reply_reserve=0, trim_fraction=0.25).trim_margin == 251


# --- plan_turn: when and what to drop -----------------------------------------------------------


def test_nothing_is_dropped_while_the_turn_fits_exactly():
    context = ContextLayout(100, 50, 2, turns(150, 150, 150, first=3))  # 600 used
    plan = plan_turn(SETTINGS, context, 200)  # 600 + 200 == 800: fits to the token
    assert plan.fits and not plan.trimmed
    assert plan.context == context and plan.prompt_tokens == 800


def test_trim_drops_oldest_whole_turns_after_pinned_part():
    context = ContextLayout(100, 50, 2, turns(150, 150, 150, first=3))
    plan = plan_turn(SETTINGS, context, 201)  # one token over
    # fixed = 100 + 50 + 201 = 351; turns may keep 800 - 250 - 351 = 199 -> only turn 5 (150)
    assert plan.drop == range(3, 5) and plan.dropped_tokens == 300
    assert plan.summary_action == "keep" and plan.summary_tokens == 50
    assert plan.context.turns == turns(150, first=5)
    assert plan.prompt_tokens == 100 + 50 + 150 + 201 == 501


def test_trim_frees_the_margin_beyond_this_turns_needs():
    context = ContextLayout(50, 0, -1, turns(*[50] * 14))  # 750 used
    plan = plan_turn(SETTINGS, context, 60)
    # fixed 110; turns may keep 800 - 250 - 110 = 440 -> the newest 8 (400), dropping 6
    assert plan.drop == range(0, 6)
    assert plan.prompt_tokens + SETTINGS.reply_reserve + SETTINGS.trim_margin <= SETTINGS.n_ctx


def test_trim_keeps_the_newest_exchange_even_when_that_misses_the_margin():
    context = ContextLayout(100, 0, -1, turns(100, 500))
    plan = plan_turn(SETTINGS, context, 150)
    # 100 + 500 + 150 = 750 fits 800 but not the 550 target: coherence wins over the margin
    assert plan.drop == range(0, 1) and plan.context.turns == turns(500, first=1)
    assert plan.prompt_tokens == 750


def test_newest_exchange_is_dropped_only_when_nothing_else_fits():
    context = ContextLayout(100, 0, -1, turns(100, 500))
    plan = plan_turn(SETTINGS, context, 201)  # 100 + 500 + 201 = 801 > 800
    assert plan.fits and plan.drop == range(0, 2) and plan.context.turns == ()
    assert plan.prompt_tokens == 301


def test_one_huge_turn_is_dropped_whole_never_in_part():
    context = ContextLayout(40, 0, -1, turns(700))
    plan = plan_turn(SETTINGS, context, 100)
    assert plan.drop == range(0, 1) and plan.dropped_tokens == 700
    assert plan.prompt_tokens == 140


def test_no_turns_and_a_message_that_fits_beside_the_system_prompt():
    plan = plan_turn(SETTINGS, ContextLayout(300), 500)
    assert plan.fits and not plan.trimmed and plan.prompt_tokens == 800


def test_summary_is_removed_only_when_the_message_fits_beside_the_system_prompt_alone():
    context = ContextLayout(300, 80, 4, turns(60, first=5))
    plan = plan_turn(SETTINGS, context, 450)
    # 300 + 80 + 450 = 830 > 800, 300 + 450 = 750 fits: the turn goes first, then the summary
    assert plan.fits and plan.summary_action == "remove" and plan.summary_tokens == 0
    assert plan.drop == range(5, 6) and plan.trimmed_n == 60 + 80
    # The summary's text is the session's; it is still the running summary of turns 0..4.
    assert plan.context.summary_through == 4


def test_pinned_part_almost_the_whole_context_still_answers_short_messages():
    context = ContextLayout(780, 0, -1, turns(15))
    plan = plan_turn(SETTINGS, context, 10)  # 805 > 800; 790 fits
    assert plan.fits and plan.drop == range(0, 1) and plan.prompt_tokens == 790
    refused = plan_turn(SETTINGS, context, 21)  # 780 + 21 > 800 even with nothing else
    assert not refused.fits and refused.overlong is not None
    assert refused.context == context and not refused.trimmed


# --- plan_turn: the summary ---------------------------------------------------------------------


def test_summary_over_the_cap_is_kept_at_a_trim():
    # The cap was lowered after this summary was made; the next summary folds it in.
    context = ContextLayout(100, 180, 0, turns(250, 250, first=1))
    kept = plan_turn(SETTINGS, context, 100)
    assert kept.summary_action == "keep" and kept.summary_tokens == 180 and kept.drop == range(1, 2)


def test_trim_without_a_ready_summary_keeps_the_old_one_and_leaves_turns_pending():
    context = ContextLayout(100, 60, 1, turns(200, 200, 200, first=2))
    plan = plan_turn(SETTINGS, context, 100)
    assert plan.summary_action == "keep" and plan.drop == range(2, 4)
    after = plan.context.with_turn(TurnSpan(5, 250))
    request = should_prepare_summary(SETTINGS, after)
    assert request is not None and request.first == 2  # turns 2 and 3 still need folding in


def test_with_summaries_off_a_trim_just_drops():
    settings = ContextSettings(n_ctx=1000, reply_reserve=200, summarize=False)
    context = ContextLayout(100, 0, -1, turns(300, 300))
    plan = plan_turn(settings, context, 150)
    assert plan.summary_action == "keep" and plan.summary_tokens == 0 and plan.drop == range(0, 1)
    assert should_prepare_summary(settings, plan.context.with_turn(TurnSpan(2, 700))) is None


# --- should_prepare_summary ----------------------------------------------------------------------


def test_no_summary_is_requested_while_the_context_has_room():
    assert should_prepare_summary(SETTINGS, ContextLayout(100, 0, -1, turns(100, 100, 100))) is None


def test_summary_request_covers_the_turns_the_next_trim_will_drop():
    context = ContextLayout(100, 0, -1, turns(100, 100, 100, 100, 100, 100))  # 700 >= 0.75 * 800
    request = should_prepare_summary(SETTINGS, context)
    # predicted: fixed 100 + 100 (cap) + 100 (next) = 300, turns may keep 250 -> keep 2
    assert request is not None and request.turns == range(0, 4)
    assert request.max_tokens == SETTINGS.summary_max_tokens and not request.fold_summary


def test_summary_request_never_covers_the_newest_exchange():
    request = should_prepare_summary(SETTINGS, ContextLayout(100, 0, -1, turns(10, 690)))
    assert request is not None and request.turns == range(0, 1)


def test_next_summary_folds_the_old_one_in_so_it_stays_under_the_cap():
    context = ContextLayout(100, 100, 4, turns(100, 100, 100, 100, 100, first=5))
    request = should_prepare_summary(SETTINGS, context)
    assert request is not None and request.fold_summary and request.first == 5


def test_a_summary_in_flight_is_never_replaced():
    context = ContextLayout(100, 0, -1, turns(100, 100, 100, 100, 100, 150))
    in_flight = SummaryRequest(first=0, through=1, fold_summary=False, max_tokens=100)
    assert should_prepare_summary(SETTINGS, context, in_flight=in_flight) is None


# --- a whole chat -----------------------------------------------------------------------------


@dataclass
class ChatRun:
    plans: list[TurnPlan]
    summary_tokens_seen: list[int]
    installed_at: list[int]  # turns before which a summary was swapped in
    final: ContextLayout


def run_chat(
    settings: ContextSettings, system: int, exchanges: list[tuple[int, int]], *, ready_after: int = 0
) -> ChatRun:
    """Drive the policy as a session would. A requested summary becomes ready ``ready_after``
    turns after the reply it was requested at, and is swapped in then, between turns (the
    turns it covers leave the context with the old summary)."""
    context, plans, seen, installed = ContextLayout(system), [], [], []
    in_flight: tuple[int, SummaryRequest] | None = None  # (turn it is ready at, request)
    for number, (new, reply) in enumerate(exchanges):
        if in_flight and number >= in_flight[0]:
            # The fake summarizer always writes as long a summary as it may.
            request, in_flight = in_flight[1], None
            kept = tuple(t for t in context.turns if t.index > request.through)
            context = ContextLayout(context.system_tokens, request.max_tokens, request.through, kept)
            installed.append(number)
        plan = plan_turn(settings, context, new)
        assert plan.fits
        plans.append(plan)
        seen.append(plan.summary_tokens)
        context = plan.context.with_turn(TurnSpan(number, new + reply))
        assert context.used_tokens <= settings.n_ctx
        building = in_flight[1] if in_flight else None
        request = should_prepare_summary(settings, context, in_flight=building)
        if request is not None:
            assert request.through < number  # never the exchange that just finished
            in_flight = (number + 1 + ready_after, request)
    return ChatRun(plans, seen, installed, context)


def test_two_consecutive_turns_of_typical_size_do_not_both_trim():
    settings = ContextSettings.for_reply(1024, 128, summary_max_tokens=128)
    run = run_chat(settings, 60, [(70, 50)] * 60)  # ANCHORS' measured chat, 60 turns long
    # A trim, or a summary swapped in (which takes the turns it covers out of the context).
    trims = sorted({i for i, plan in enumerate(run.plans) if plan.trimmed} | set(run.installed_at))
    assert trims, "a 60-turn chat must outgrow 1024 tokens"
    assert all(b - a > 1 for a, b in zip(trims, trims[1:]))


def test_a_long_chat_keeps_the_summary_under_the_cap_and_folds_every_dropped_turn():
    settings = ContextSettings.for_reply(1024, 128, summary_max_tokens=96)
    rng = random.Random(4)
    exchanges = [(rng.randint(10, 120), rng.randint(5, 128)) for _ in range(200)]
    run = run_chat(settings, 50, exchanges)
    assert max(run.summary_tokens_seen) <= 96
    assert len(run.installed_at) >= 5
    # Summaries ready in time: every turn is in the summary the moment it leaves the context.
    for plan in run.plans:
        oldest_in_context = plan.context.turns[0].index if plan.context.turns else len(run.plans)
        assert plan.context.summary_through in (-1, oldest_in_context - 1)


def test_a_summary_that_is_late_never_blocks_a_trim():
    settings = ContextSettings.for_reply(1024, 128, summary_max_tokens=96)
    run = run_chat(settings, 50, [(80, 60)] * 80, ready_after=3)
    assert all(plan.fits for plan in run.plans)
    assert any(plan.trimmed and plan.summary_action == "keep" for plan in run.plans)
    assert any(turn >= 40 for turn in run.installed_at)  # it catches up


# --- invariants over generated shapes -----------------------------------------------------------


def random_case(rng: random.Random) -> tuple[ContextSettings, ContextLayout, int]:
    n_ctx = rng.choice([256, 512, 1000, 4096])
    settings = ContextSettings(
        n_ctx=n_ctx,
        reply_reserve=rng.randint(0, n_ctx // 2),
        trim_fraction=rng.choice([0.0, 0.1, 0.25, 0.5]),
        summary_max_tokens=rng.choice([0, 32, 128, 256]),
        summarize=rng.random() < 0.8,
        overlong=rng.choice(["refuse", "head_tail"]),
    )
    system = rng.choice([0, rng.randint(1, n_ctx // 4), rng.randint(0, n_ctx)])
    summary_through = rng.randint(-1, 5)
    first = summary_through + 1 + rng.choice([0, 0, rng.randint(1, 3)])
    sizes = [rng.choice([rng.randint(1, 60), rng.randint(1, n_ctx)]) for _ in range(rng.randint(0, 12))]
    summary = rng.randint(0, 300) if summary_through >= 0 else 0
    context = ContextLayout(system, summary, summary_through, turns(*sizes, first=first))
    return settings, context, rng.choice([1, rng.randint(1, 200), rng.randint(1, 2 * n_ctx)])


def test_every_plan_keeps_the_budget_promise():
    rng = random.Random(1139)  # upstream's overflow issue
    for _ in range(5000):
        settings, context, new = random_case(rng)
        plan = plan_turn(settings, context, new)
        capacity = settings.prompt_capacity
        assert plan.fits == (context.system_tokens + new <= capacity)
        if not plan.fits:
            assert plan.overlong is not None and plan.context == context and not plan.trimmed
            continue
        assert plan.prompt_tokens + settings.reply_reserve <= settings.n_ctx
        # Dropped turns are the oldest, whole, and the kept ones are what is left.
        kept = plan.context.turns
        assert context.turns == (*(t for t in context.turns if t.index in plan.drop), *kept)
        assert plan.dropped_tokens == context.turn_tokens - plan.context.turn_tokens
        if context.used_tokens + new <= capacity:
            assert not plan.trimmed
            continue
        if plan.summary_action == "remove":
            assert context.system_tokens + context.summary_tokens + new > capacity
        # Either the margin is free, or only the newest exchange (or nothing) is left.
        margin_free = plan.prompt_tokens + settings.trim_margin <= capacity
        assert margin_free or len(kept) <= 1
        # Nothing more than needed: keeping one more turn would miss the margin, or it is summarized.
        if plan.drop and kept:
            last_dropped = context.turns[len(plan.drop) - 1]
            too_much = plan.prompt_tokens + last_dropped.tokens + settings.trim_margin > capacity
            assert too_much or last_dropped.index <= plan.context.summary_through


def test_remote_selection_never_exceeds_the_budget():
    rng = random.Random(8798)
    for _ in range(3000):
        budget, reserve = rng.choice([512, 4096, 32768]), rng.randint(0, 1000)
        history = turns(*[rng.randint(1, 2000) for _ in range(rng.randint(0, 20))])
        summary_through = rng.randint(-1, len(history) - 1)
        summary = rng.randint(1, 300) if summary_through >= 0 else 0
        selection = select_for_remote(
            budget, rng.randint(0, 500), history, rng.randint(1, 3000),
            reply_reserve=reserve, summary_tokens=summary, summary_through=summary_through,
        )
        if selection.fits:
            assert selection.prompt_tokens + reserve <= budget
            assert not selection.turns or selection.turns.stop == len(history)  # newest, no gap


# --- over-long messages --------------------------------------------------------------------------


def test_a_message_that_fits_beside_the_system_prompt_is_not_overlong():
    assert overlong_message(SETTINGS, 100, 700) is None  # 1000 - 200 - 100 = 700


def test_refusal_gives_the_numbers():
    decision = overlong_message(SETTINGS, 100, 5000, overhead_tokens=5)
    assert decision is not None and decision.action == "refuse"
    assert decision.available_tokens == 695 and decision.cut_tokens == 5000
    for number in ("5,000", "1,000", "100", "200", "695"):
        assert number in decision.message


def test_head_tail_keeps_exactly_what_is_available_around_the_marker():
    settings = ContextSettings(n_ctx=1000, reply_reserve=200, overlong="head_tail")
    decision = overlong_message(settings, 100, 5000, overhead_tokens=5, marker_tokens=12)
    assert decision is not None and decision.action == "head_tail"
    assert (decision.keep_head, decision.keep_tail) == (341, 342)  # 695 - 12 = 683
    assert decision.cut_tokens == 5000 - 683
    assert "4,317" in decision.message


def test_head_tail_refuses_when_the_marker_would_leave_almost_nothing():
    settings = ContextSettings(n_ctx=1000, reply_reserve=200, overlong="head_tail")
    decision = overlong_message(settings, 790, 100, marker_tokens=9)  # 10 available, 1 to keep
    assert decision is not None and decision.action == "refuse"


def test_after_a_head_tail_cut_the_message_fits_and_shows_the_marker():
    settings = ContextSettings(n_ctx=1000, reply_reserve=200, overlong="head_tail")
    message = list(range(3000))
    context = ContextLayout(100, 0, -1, turns(300))
    plan = plan_turn(settings, context, 3000 + 5, new_overhead_tokens=5, marker_tokens=3)
    decision = plan.overlong
    assert not plan.fits and decision is not None and decision.action == "head_tail"
    cut = head_tail_cut(message, decision.keep_head, decision.keep_tail, [-1, -2, -3])
    assert cut[decision.keep_head : decision.keep_head + 3] == [-1, -2, -3]
    assert cut[0] == 0 and cut[-1] == 2999
    replanned = plan_turn(settings, context, len(cut) + 5)
    assert replanned.fits and replanned.prompt_tokens == 800


def test_head_tail_cut_on_text_and_when_nothing_needs_cutting():
    assert head_tail_cut("abcdefghij", 3, 2, "[…]") == "abc[…]ij"
    assert head_tail_cut("abcdefghij", 4, 0, "…") == "abcd…"
    assert head_tail_cut("short", 3, 2, "[…]") == "short"
    assert head_tail_cut((1, 2, 3), 2, 2, [0]) == [1, 2, 3]


def test_marker_text_says_how_much_was_cut_on_its_own_line():
    assert marker_text(SETTINGS, 4317) == "\n[… 4,317 tokens cut …]\n"


# --- remote budget -----------------------------------------------------------------------------


def test_remote_gets_the_whole_history_without_the_summary_when_it_fits():
    selection = select_for_remote(
        4096, 100, turns(500, 500), 100, reply_reserve=500, summary_tokens=80, summary_through=0
    )
    assert selection.turns == range(0, 2) and not selection.include_summary
    assert selection.prompt_tokens == 1200


def test_remote_gets_summary_and_the_newest_turns_that_fit():
    history = turns(900, 900, 900, 900)
    selection = select_for_remote(
        3000, 100, history, 100, reply_reserve=500, summary_tokens=200, summary_through=1
    )
    # room 2300 - summary 200 = 2100: two newest turns
    assert selection.include_summary and selection.turns == range(2, 4)
    assert selection.prompt_tokens == 100 + 100 + 200 + 1800


def test_remote_never_sends_a_history_with_a_gap():
    selection = select_for_remote(3000, 0, turns(10, 2500, 10), 100, reply_reserve=500)
    assert selection.turns == range(2, 3)


def test_remote_refuses_a_message_longer_than_its_budget_with_the_numbers():
    selection = select_for_remote(2048, 100, turns(10), 4000, reply_reserve=512)
    assert not selection.fits and selection.overlong is not None
    assert "4,000" in selection.overlong.message and "1,436" in selection.overlong.message
