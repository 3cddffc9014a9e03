"""join_steps: what a coalesced answer (GenerateRequest.coalesce) and a slow
reader's piled-up steps get. Readers take a delta's reasoning, then its text,
then its calls, so a join must keep a choice's runs in the order they came."""

from __future__ import annotations

from service.generation.job import ChoiceDelta, StepOutput, ToolCallFragment, join_steps


def step(*deltas: ChoiceDelta) -> StepOutput:
    return StepOutput(tuple(deltas))


def test_text_after_a_call_stays_after_it():
    call = ToolCallFragment(0, "call_1", "f", "")
    steps = [step(ChoiceDelta(0, "Let me ", (1,))),
             step(ChoiceDelta(0, "check.", (2,))),
             step(ChoiceDelta(0, "", (3,), tool_calls=(call,))),
             step(ChoiceDelta(0, "", (4,), tool_calls=(ToolCallFragment(0, arguments="{}"),))),
             step(ChoiceDelta(0, "Done.", (5,), finish_reason="stop"))]
    joined = join_steps(steps).deltas
    # Text then a call is one delta (read text first); the text after it is its own.
    assert [(d.text, len(d.tool_calls), d.token_ids, d.finish_reason) for d in joined] == [
        ("Let me check.", 2, (1, 2, 3, 4), None),
        ("Done.", 0, (5,), "stop")]
    assert "".join(f.arguments for f in joined[0].tool_calls) == "{}"


def test_reasoning_after_text_starts_a_new_delta_and_choices_keep_their_own():
    steps = [step(ChoiceDelta(0, "", (1,), reasoning="think "), ChoiceDelta(1, "b", (7,))),
             step(ChoiceDelta(0, "", (2,), reasoning="more"), ChoiceDelta(1, "c", (8,))),
             step(ChoiceDelta(0, "answer", (3,)),
                  ChoiceDelta(1, "", (9,), finish_reason="stop", stop_sequence="\n")),
             step(ChoiceDelta(0, "", (4,), reasoning="again")),
             step(ChoiceDelta(0, "end", (5,), finish_reason="length", logprobs=("lp",)))]
    joined = join_steps(steps).deltas
    zero = [(d.reasoning, d.text, d.token_ids, d.finish_reason, d.logprobs)
            for d in joined if d.index == 0]
    assert zero == [("think more", "answer", (1, 2, 3), None, ()),
                    ("again", "end", (4, 5), "length", ("lp",))]
    (one,) = [d for d in joined if d.index == 1]
    assert (one.text, one.token_ids, one.finish_reason, one.stop_sequence) == (
        "bc", (7, 8, 9), "stop", "\n")


def test_one_step_is_returned_as_it_is():
    only = step(ChoiceDelta(0, "a", (1,)))
    assert join_steps([only]) is only


def test_a_plain_run_is_one_delta_whatever_its_texts():
    """The shape a streamed reader piles most: one text delta a step (some
    empty, as a token that ends inside a character gives)."""
    steps = [step(ChoiceDelta(2, "The", (1,), logprobs=("a",))),
             step(ChoiceDelta(2, "", (2,), logprobs=("b",))),
             step(ChoiceDelta(2, " mill", (3,), logprobs=("c",))),
             step(ChoiceDelta(2, ".", (4,), "stop", ("d",), stop_sequence="\n"))]
    (joined,) = join_steps(steps).deltas
    assert joined == ChoiceDelta(2, "The mill.", (1, 2, 3, 4), "stop", ("a", "b", "c", "d"),
                                 (), "\n", "")
    # Another choice's delta in the run is not plain: each keeps its own.
    mixed = join_steps(steps[:2] + [step(ChoiceDelta(3, "x", (9,)))]).deltas
    assert [(d.index, d.text, d.token_ids) for d in mixed] == [(2, "The", (1, 2)), (3, "x", (9,))]
