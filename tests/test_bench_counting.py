"""bench/constraints.py counts the prompt tokens llama.cpp evaluates for n
choices against n requests by driving the GGUF engine's Runner itself; it
shares that Runner's row-tools signature, which once changed under it (the
bench died on its last section). Run here so such a change fails a test."""

from __future__ import annotations

from bench.constraints import N, evaluated_by_llama_cpp


def test_constraints_bench_counts_prompt_tokens_on_the_runner():
    length, together, apart = evaluated_by_llama_cpp("millm-tiny-gguf:Q8_0")
    assert length > 100
    assert together == length  # the n choices share one prompt evaluation
    assert apart == N * length  # separate requests sent at once each evaluate it
