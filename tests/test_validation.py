"""Unit tests of the resolution step: defaults and seeds."""

from __future__ import annotations

import pytest

from service.errors import EngineError
from service.requests.checks import check_params
from service.requests.generation import resolve, row_seeds
from service.requests.params import ChatTurn, GenerateParams


def test_default_max_tokens_chat_fills_context_raw_prompt_is_16():
    chat = GenerateParams(model="m", messages=(ChatTurn("user", "hi"),))
    spec = resolve(chat, check_params(chat), [[1] * 24], 100, "r")
    assert spec.groups[0].max_tokens == 76
    raw = GenerateParams(model="m", prompts=("hi",))
    spec = resolve(raw, check_params(raw), [[1] * 24], 100, "r")
    assert spec.groups[0].max_tokens == 16


def test_max_completion_tokens_stands_for_max_tokens():
    params = GenerateParams(model="m", prompts=("x",), max_completion_tokens=7)
    assert check_params(params).max_tokens == 7
    same = GenerateParams(model="m", prompts=("x",), max_completion_tokens=7, max_tokens=7)
    assert check_params(same).max_tokens == 7


def test_context_fit_counts_prompt_and_completion():
    params = GenerateParams(model="m", prompts=("x",), max_tokens=10)
    fits = resolve(params, check_params(params), [[1] * 90], 100, "r")  # exactly fits
    assert fits.groups[0].max_tokens == 10 and fits.max_tokens_cap is None
    # Past the window's room, max_tokens is capped to it (issue 42 item 5)...
    capped = resolve(params, check_params(params), [[1] * 91], 100, "r")
    assert capped.groups[0].max_tokens == 9 and capped.max_tokens_cap == (10, 9)
    # ...unless the caller is strict, and a prompt leaving no room is refused.
    strict = GenerateParams(model="m", prompts=("x",), max_tokens=10, strict=True)
    for p, ids in ((strict, [1] * 91), (params, [1] * 100), (params, [1] * 150)):
        with pytest.raises(EngineError) as err:
            resolve(p, check_params(p), [ids], 100, "r")
        assert err.value.code == "context_length_exceeded"
    assert "101 tokens (91 in the prompt, 10 in the completion)" in str(
        pytest.raises(EngineError, resolve, strict, check_params(strict), [[1] * 91], 100,
                      "r").value.message)


def test_several_prompts_are_capped_to_each_ones_room_and_name_the_one_too_long():
    params = GenerateParams(model="m", prompts=("a", "b"), max_tokens=10)
    spec = resolve(params, check_params(params), [[1], [1] * 95], 100, "r")
    assert [g.max_tokens for g in spec.groups] == [10, 5] and spec.max_tokens_cap == (10, 5)
    with pytest.raises(EngineError) as err:
        resolve(params, check_params(params), [[1], [1] * 100], 100, "r")
    assert "prompt[1]" in err.value.message


def test_row_seeds():
    assert row_seeds(5, 3) == row_seeds(5, 3)
    assert row_seeds(5, 3)[0] == 5
    assert len(set(row_seeds(5, 3))) == 3
    assert row_seeds(5, 1) != row_seeds(6, 1)
    assert row_seeds(None, 2) != row_seeds(None, 2)


def test_prompt_count_is_capped():
    with pytest.raises(EngineError) as err:
        check_params(GenerateParams(model="m", prompts=("x",) * 2049))
    assert err.value.param == "prompt"


def test_nan_is_refused_naming_the_field():
    with pytest.raises(EngineError) as err:
        check_params(GenerateParams(model="m", prompts=("x",), top_p=float("nan")))
    assert err.value.param == "top_p"


def test_the_chat_roles_are_the_contracts_roles():
    """One table: the engine's roles are the contract's Role values by name."""
    from millm.v1 import generation_pb2
    from service.requests.params import CHAT_ROLES

    assert CHAT_ROLES == tuple(name.removeprefix("ROLE_").lower()
                               for name, value in generation_pb2.Role.items() if value)
