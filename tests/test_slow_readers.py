"""A caller that stops reading its stream (generation/job.py): once its events
have waited untaken for MILLM_STREAM_STALL_S, its rows stop generating and its
call ends, which frees its model lease. Observed on the engine's counters."""

from __future__ import annotations

import grpc

from millm.v1 import generation_service_pb2_grpc, server_service_pb2_grpc
from tests.conftest import inference_status, wait_until
from tests.grpc_helpers import prompt_request
from tests.harness import start_engine, wait_serving

PROMPTS = [f"Reader {i} waits by the river" for i in range(8)]
MAX_TOKENS = 900


def test_a_reader_that_stops_reading_is_cancelled_and_frees_its_rows(tmp_path):
    engine, port = start_engine(tmp_path, MILLM_STREAM_STALL_S="1")
    try:
        wait_serving(engine, port)
        # No flow-control window growth: the engine feels a stopped reader soon.
        with grpc.insecure_channel(f"127.0.0.1:{port}",
                                   options=[("grpc.http2.bdp_probe", 0)]) as channel:
            server = server_service_pb2_grpc.ServerServiceStub(channel)

            def status():
                return inference_status(server, timeout=10)

            stub = generation_service_pb2_grpc.GenerationServiceStub(channel)
            # Five alternatives per token: far more bytes than any flow-control
            # window, however the engine merges its steps for a slow reader.
            call = stub.Generate(prompt_request(*PROMPTS, max_tokens=MAX_TOKENS, logprobs=5,
                                                temperature=0, ignore_eos=True), timeout=300)
            next(call)  # the metadata; then nothing more is read
            assert wait_until(lambda: status().active_generations == 1, timeout=30)
            assert wait_until(lambda: status().active_generations == 0, timeout=120)
            after = status()
            assert after.cancelled_generations_total == 1
            assert after.completed_generations_total == 0
            assert after.generated_tokens_total < len(PROMPTS) * MAX_TOKENS
            assert "stream_stalled" in engine.log()
            call.cancel()
    finally:
        engine.stop()
