"""Constrained sampling on the real test model (and a random-weight model with a 262,144-token
vocabulary): answers in the schema's shape at any temperature, the cache still exact, reasoning
free, lazy grammars waiting for their trigger, speculation unchanged, Esc within a token, and
redraws that pick what a pass over the whole vocabulary picks."""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest
from oracle import GREEDY, assert_matches_fresh, loaded_engine, reply_tokens
from reasoning_templates import THINKING
from schema_samples import random_schema

from localchat.context.chat_context import ChatContext
from localchat.engine.options import Sampling
from localchat.engine.sampling import constrained as constrain
from localchat.engine.sampling.sampler import Sampler
from localchat.events import Done, Failed, Thinking, Token
from localchat.formats import read_schema, schema_format
from localchat.formats.constraint import AnswerGate, Constraint, Verdict

PERSON = schema_format(read_schema("name, age int, city"))
MOVIE = schema_format({
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 60},
        "year": {"type": "integer", "minimum": 1900, "maximum": 2030},
        "genres": {"type": "array", "items": {"enum": ["drama", "comedy", "action", "sci-fi"]},
                   "minItems": 1, "maxItems": 3},
        "rating": {"type": "number", "minimum": 0},
        "sequel": {"type": ["boolean", "null"]},
    },
    "required": ["title", "year", "genres", "rating", "sequel"],
    "additionalProperties": False,
})


def constrained(answer_format, **settings) -> Sampling:
    base = dict(temperature=0.0, repeat_penalty=1.0, max_tokens=160)
    return Sampling(**{**base, **settings}, constraint=Constraint(answer_format.grammar))


def answer(engine, prompt: str, sampling: Sampling) -> Done:
    engine.reset()
    final = None
    for event in engine.submit([{"role": "user", "content": prompt}], sampling):
        final = event
    assert isinstance(final, Done), final
    return final


@pytest.mark.parametrize("answer_format, prompt", [
    (PERSON, "Describe a person as JSON."),
    (MOVIE, "Give me a famous movie as JSON."),
])
@pytest.mark.parametrize("settings", [dict(), dict(temperature=0.8, seed=5, repeat_penalty=1.1),
                                      dict(temperature=1.2, seed=11, top_k=0, top_p=1.0, min_p=0.0)],
                         ids=["greedy", "sampled", "no-top-k"])
def test_answers_follow_the_schema_at_any_temperature(engine, answer_format, prompt, settings):
    done = answer(engine, prompt, constrained(answer_format, **settings))
    assert done.finish_reason == "stop"
    assert answer_format.problem(done.reply) is None, done.reply
    assert done.timings.constrained_n == done.timings.predicted_n + 1  # each, and the end


def test_generated_schemas_are_answered_in_their_shape(engine):
    """With the default repeat penalty: without one, greedy decoding of this small model loops
    in an unbounded array until the token limit (an incomplete answer, as it should be)."""
    rng = random.Random(7)
    for _ in range(5):
        schema = random_schema(rng)
        answer_format = schema_format(schema)
        done = answer(engine, "Fill in this JSON: " + json.dumps(schema)[:300],
                      constrained(answer_format, max_tokens=400, repeat_penalty=1.1))
        assert done.finish_reason == "stop", (schema, done.reply)
        assert answer_format.problem(done.reply) is None, (schema, done.reply)


def test_a_conversation_with_a_schema_answers_as_a_fresh_prefill_would(engine, fresh):
    """The greedy oracle: turns with and without a schema, each reusing the cache, each equal
    to a fresh engine's reply to the same visible history under the same constraint."""
    schema_greedy = replace(GREEDY, constraint=Constraint(MOVIE.grammar), max_tokens=48)
    chat = ChatContext(engine, system="You answer briefly.", sampling=GREEDY)
    for text, sampling in [("Name a movie you like.", GREEDY),
                           ("Now as JSON, please.", schema_greedy),
                           ("Why that one?", GREEDY),
                           ("Another one as JSON.", schema_greedy)]:
        tokens, done = reply_tokens(chat.send(text, sampling))
        assert done.timings.approx_n == 0
        assert_matches_fresh(tokens, fresh, chat.last_sent, sampling)
        if sampling is schema_greedy:
            assert done.timings.cache_n > 0 and done.timings.constrained_n > 0


def test_a_stop_ends_a_constrained_reply_within_one_token(engine):
    handle = engine.submit([{"role": "user", "content": "Describe a person as JSON."}],
                           constrained(MOVIE, max_tokens=300))
    after_stop = seen = 0
    for event in handle:
        if isinstance(event, Token):
            seen += 1
            after_stop += handle.stop_requested
            if seen == 6:
                handle.stop()
    done = handle.result
    assert isinstance(done, Done) and done.finish_reason == "aborted"
    assert after_stop <= 1 and done.reply and MOVIE.problem(done.reply) is not None


def test_a_grammar_llama_cpp_refuses_ends_the_turn_before_anything_is_prefilled(engine):
    chat = ChatContext(engine, sampling=GREEDY)
    for _ in reply_tokens(chat.send("Hi.")):
        pass
    held = engine.tokens_in_context
    for grammar, words in [('root ::= "a" (', "does not parse"),
                           ('root ::= undefined-rule', "Undefined rule identifier"),
                           ('start ::= "a"', "no start rule 'root'"),
                           ('root ::= root "a" | "b"', "left recursion")]:
        handle = engine.submit([{"role": "user", "content": "Hi."}, {"role": "assistant", "content": "x"},
                                {"role": "user", "content": "Again."}],
                               replace(GREEDY, constraint=Constraint(grammar)))
        final = list(handle)[-1]
        assert isinstance(final, Failed) and words in final.message and "\n" not in final.message
        assert engine.tokens_in_context == held  # the cache was not touched


def test_a_lazy_grammar_waits_for_its_trigger(engine):
    """Free text until the pattern matches; from the match (its capture group) the grammar's."""
    grammar = 'root ::= "{" ws "\\"ok\\"" ws ":" ws ("true" | "false") ws "}"\nws ::= [ \\n]{0,4}\n'
    free = answer(engine, "Reply with a JSON object saying ok.", replace(GREEDY, max_tokens=40))
    assert free.reply.startswith("```"), free.reply  # the model opens a fence: free text
    for constraint in [Constraint(grammar, trigger_patterns=(r"\{",)),
                       Constraint(grammar, trigger_patterns=(r"json\s*(\{)",)),
                       Constraint(grammar, trigger_tokens=(engine.tokenize("{")[0],))]:
        done = answer(engine, "Reply with a JSON object saying ok.",
                      replace(GREEDY, max_tokens=60, constraint=constraint))
        before, brace, after = done.reply.partition("{")
        assert before == free.reply.partition("{")[0]  # unchanged until the trigger
        assert json.loads(brace + after).keys() == {"ok"} and done.finish_reason == "stop", done.reply


def test_reasoning_is_free_and_the_answer_after_it_follows_the_schema(test_model_path, monkeypatch):
    """A template that opens a reasoning block: the reasoning is the model's own, unconstrained
    (the test model never closes the block by itself, so it is made to after a few tokens), and
    the answer after ``</think>`` follows the schema."""
    with loaded_engine(test_model_path, 1024, "thinking", chat_template=THINKING,
                       speculative="off") as thinking:
        prompt = "Describe a person as JSON."
        closing = thinking.tokenize("</think>\n\n")
        original, drawn = Sampler._draw, []

        def closes_after_six(self, index):
            drawn.append(None)
            step = len(drawn) - 7
            return closing[step] if 0 <= step < len(closing) else original(self, index)

        plain = [e.text for e in thinking.submit([{"role": "user", "content": prompt}],
                                                 replace(GREEDY, max_tokens=6))
                 if isinstance(e, Thinking)]
        monkeypatch.setattr(Sampler, "_draw", closes_after_six)
        events = list(thinking.submit([{"role": "user", "content": prompt}],
                                      constrained(PERSON, max_tokens=120)))
        done = events[-1]
        assert isinstance(done, Done) and done.finish_reason == "stop"
        reasoning = "".join(e.text for e in events if isinstance(e, Thinking))
        assert reasoning.strip() == "".join(plain).strip() and not reasoning.lstrip().startswith("{")
        assert PERSON.problem(done.answer) is None, done.reply
        assert done.timings.thinking_n >= 6


def test_drafts_the_grammar_rejects_end_the_draft_and_the_reply_is_unchanged(exact_engine,
                                                                            always_draft):
    """Prompt lookup drafts from the prompt, whose JSON has a key the schema forbids: the drafts
    that copy it are cut where the grammar rejects them, and the constrained reply is the same
    with and without drafts (checks on this engine round exactly as single decodes)."""
    prompt = ('Return this JSON unchanged: {"title": "Alien", "director": "Ridley Scott", '
              '"year": 1979, "genres": ["sci-fi", "action"], "rating": 8.5, "sequel": false}')
    sampling = constrained(MOVIE, max_tokens=80)
    replies = {}
    for mode in ("off", "ngram"):
        exact_engine.set_speculative(mode)
        replies[mode] = answer(exact_engine, prompt, sampling)
    assert replies["ngram"].reply == replies["off"].reply
    assert MOVIE.problem(replies["ngram"].reply) is None
    timings = replies["ngram"].timings
    assert timings.draft_n_accepted > 0 and timings.draft_n > timings.draft_n_accepted


def test_a_token_the_grammar_redrew_carries_no_confidence_numbers(test_model_path):
    """Its probability under the model's own distribution (the model wanted another token) must
    not tell the escalation monitor that the model is unsure."""
    with loaded_engine(test_model_path, 512, "confidence", track_confidence=True,
                       speculative="off") as tracked:
        events = list(tracked.submit([{"role": "user", "content": "Give me a famous movie as JSON."}],
                                     constrained(MOVIE, max_tokens=24)))
    tokens = [e for e in events if isinstance(e, Token)]
    redrawn = events[-1].timings.redrawn_n
    unscored = [t for t in tokens if t.prob is None]
    assert redrawn > 0 and 0 < len(unscored) <= redrawn
    assert len(tokens) - len(unscored) > 0


def whole_vocabulary_only(monkeypatch) -> None:
    """Every redraw checks the whole vocabulary (llama.cpp's common sampler's way)."""
    monkeypatch.setattr(constrain, "WINDOWS", ())


@pytest.mark.parametrize("settings", [dict(), dict(temperature=0.9, seed=3, repeat_penalty=1.1)],
                         ids=["greedy", "sampled"])
def test_redraws_pick_what_a_whole_vocabulary_pass_picks(engine, monkeypatch, settings):
    sampling = constrained(MOVIE, **settings)
    fast = answer(engine, "Give me a famous movie as JSON.", sampling)
    assert fast.timings.redrawn_n > 0 and fast.timings.vocab_passes < fast.timings.redrawn_n
    whole_vocabulary_only(monkeypatch)
    slow = answer(engine, "Give me a famous movie as JSON.", sampling)
    assert slow.timings.vocab_passes == slow.timings.redrawn_n
    assert fast.reply == slow.reply


def test_a_262k_vocabulary_model_answers_in_shape_without_whole_vocabulary_passes(
        synthetic_model, monkeypatch):
    """Random weights: almost every token it prefers is one the grammar rejects, the worst case
    for redraws. The answer still has the schema's shape, no redraw needs the whole vocabulary,
    and each picks what a pass over all 262,144 tokens picks."""
    short = schema_format({"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 6}, "n": {"type": "integer", "minimum": 0,
                                                          "maximum": 99},
        "ok": {"type": "boolean"}}, "required": ["name", "n", "ok"]})
    with loaded_engine(synthetic_model("vocab262k"), 512, "vocab262k", speculative="off") as big:
        sampling = constrained(short, max_tokens=300)
        fast = answer(big, "A record as JSON.", sampling)
        assert fast.finish_reason == "stop" and short.problem(fast.reply) is None, fast.reply
        assert fast.timings.redrawn_n > 10 and fast.timings.vocab_passes == 0
        whole_vocabulary_only(monkeypatch)
        assert answer(big, "A record as JSON.", sampling).reply == fast.reply


def gate_run(gate: AnswerGate, pieces: list[str]) -> list[Verdict]:
    verdicts = []
    for i, text in enumerate(pieces):
        verdict = gate.judge(text)
        verdicts.append(verdict)
        if verdict is not Verdict.REFUSED:
            gate.advance(i, text, verdict)
    return verdicts


def test_the_gate_frees_reasoning_and_whitespace_before_the_answer():
    F, G, R = Verdict.FREE, Verdict.GRAMMAR, Verdict.REFUSED
    opened = AnswerGate(inside_reasoning=True, patterns=(), trigger_tokens=())
    assert gate_run(opened, ["Let", " me", " think", "</", "think", ">", "\n\n", "{", "}"]) == \
        [F, F, F, F, F, F, F, G, G]
    refused = AnswerGate(inside_reasoning=True, patterns=(), trigger_tokens=())
    assert gate_run(refused, ["Hm", "</think>{"]) == [F, R]
    by_reply = AnswerGate(inside_reasoning=False, patterns=(), trigger_tokens=())
    assert gate_run(by_reply, ["<think>", "x", "</think>", "\n", "{"]) == [F, F, F, F, G]
    plain = AnswerGate(inside_reasoning=False, patterns=(), trigger_tokens=())
    assert gate_run(plain, ["\n", "{"]) == [G, G]  # no reasoning: the grammar from the first token


def test_the_gate_starts_a_lazy_grammar_at_its_trigger():
    import re

    gate = AnswerGate(False, (re.compile(r"<tool_call>"),), ())
    fed = [gate.advance(i, t, gate.judge(t)) for i, t in enumerate(["I will", " call <tool", "_call>"])]
    assert fed == [None, None, "<tool_call>"] and gate.judge("{") is Verdict.GRAMMAR
    grouped = AnswerGate(False, (re.compile(r"call:\s*(\w)"),), ())
    assert [grouped.advance(i, t, Verdict.FREE) for i, t in enumerate(["call: ", "abc"])] == [None, "abc"]
    by_token = AnswerGate(False, (), (42,))
    assert by_token.advance(7, "x", Verdict.FREE) is None and by_token.advance(42, "<t>", Verdict.FREE) == "<t>"
