"""A setting read from the environment is held to its flag's choices: argparse
checks `choices` only for flags, so MILLM_GGUF_FLASH_ATTN=true once meant
"off" and a misspelt MILLM_TORCH_LINEAR meant plain linears, silently."""

from __future__ import annotations

import pytest

from rest_bridge.config import parse_config as bridge_config
from service.config import parse_config as engine_config


@pytest.mark.parametrize("parse, name, value", [
    (engine_config, "MILLM_TORCH_LINEAR", "bf15"),
    (engine_config, "MILLM_GGUF_FLASH_ATTN", "true"),
    (engine_config, "MILLM_BATCHING", "batched"),
    (bridge_config, "MILLM_ROUTING", "rr"),
    (engine_config, "MILLM_SCHED_POLICY", "idle"),
    (bridge_config, "MILLM_SCHED_POLICY", "fifo"),
])
def test_a_value_outside_the_choices_stops_the_server_naming_it(
        monkeypatch, capsys, parse, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as stopped:
        parse([])
    assert stopped.value.code == 2
    assert f"{name} must be one of" in capsys.readouterr().err


def test_values_inside_the_choices_still_parse(monkeypatch):
    monkeypatch.setenv("MILLM_GGUF_FLASH_ATTN", "on")
    monkeypatch.setenv("MILLM_TORCH_LINEAR", "plain")
    config = engine_config([])
    assert (config.gguf_flash_attn, config.torch_linear) == (True, "plain")
    monkeypatch.setenv("MILLM_ROUTING", "round_robin")
    assert bridge_config([]).routing == "round_robin"
