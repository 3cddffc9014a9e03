"""The engine server in-process: NOT_SERVING until its model has loaded.

grpcio-testing drives only synchronous servicers, so the asyncio servicers are
exercised on a real grpc.aio server on loopback instead.
"""

from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from millm.v1 import (
    generation_service_pb2_grpc,
    model_pb2,
    model_service_pb2,
    model_service_pb2_grpc,
)
from service.config import EngineConfig
from service.server import EngineServer
from tests.grpc_helpers import chat_request, error_info
from tests.harness import models_dir


def test_not_serving_until_loaded(tmp_path):
    async def main():
        config = EngineConfig(host="127.0.0.1", grpc_port=0, data_dir=tmp_path,
                              models_dir=models_dir(), model="millm-tiny")
        server = EngineServer(config)
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
                health = health_pb2_grpc.HealthStub(channel)
                models = model_service_pb2_grpc.ModelServiceStub(channel)
                generation = generation_service_pb2_grpc.GenerationServiceStub(channel)

                async def health_of(service):
                    reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
                    return reply.status

                assert await health_of("") == health_pb2.HealthCheckResponse.NOT_SERVING
                # Listing answers while generation cannot.
                assert await health_of("millm.v1.ModelService") == \
                    health_pb2.HealthCheckResponse.SERVING
                # What needs the model waits for it too.
                for bound in ("millm.v1.ScoringService", "millm.v1.EmbeddingService",
                              "millm.v1.TokenizationService"):
                    assert await health_of(bound) == health_pb2.HealthCheckResponse.NOT_SERVING
                listed = (await models.ListModels(model_service_pb2.ListModelsRequest())).models
                assert [m.state for m in listed if m.id == "millm-tiny"] == \
                    [model_pb2.MODEL_STATE_READY]
                try:
                    async for _ in generation.Generate(chat_request()):
                        pass
                    raise AssertionError("generation answered before the model loaded")
                except grpc.aio.AioRpcError as exc:
                    assert exc.code() == grpc.StatusCode.UNAVAILABLE
                    assert error_info(exc).reason == "model_not_loaded"

                await server.load_startup_model()
                assert await health_of("") == health_pb2.HealthCheckResponse.SERVING
                assert await health_of("millm.v1.TokenizationService") == \
                    health_pb2.HealthCheckResponse.SERVING
                responses = [r async for r in generation.Generate(chat_request(max_tokens=2))]
                assert responses[-1].usage.completion_tokens <= 2
        finally:
            await server.stop()

    asyncio.run(main())
