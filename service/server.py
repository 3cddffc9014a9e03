"""Assembling and running the grpc.aio engine server."""

from __future__ import annotations

import asyncio
import logging
import signal

import grpc
import torch
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from common import api_keys, grpc_limits
from millm.v1 import (
    batch_service_pb2,
    batch_service_pb2_grpc,
    embedding_service_pb2,
    embedding_service_pb2_grpc,
    generation_service_pb2,
    generation_service_pb2_grpc,
    model_service_pb2,
    model_service_pb2_grpc,
    monitoring_service_pb2,
    monitoring_service_pb2_grpc,
    ranking_service_pb2,
    ranking_service_pb2_grpc,
    response_service_pb2,
    response_service_pb2_grpc,
    scoring_service_pb2,
    scoring_service_pb2_grpc,
    server_service_pb2,
    server_service_pb2_grpc,
    steering_service_pb2,
    steering_service_pb2_grpc,
    tokenization_service_pb2,
    tokenization_service_pb2_grpc,
)
from service.batches.batches import BatchStore
from service.batches.files import FileStore
from service.config import EngineConfig
from service.engines import model_thread
from service.engines.admission import SchedulerLimits
from service.inference import InferenceService
from service.metrics import EngineMetrics
from service.models.lifecycle import Phase
from service.models.lifecycle_config import LifecycleConfig
from service.models.registry import ModelRegistry
from service.ranking import Ranking
from service.responses.store import ResponseStore, Retention
from service.servicers.access import Access, AccessInterceptor, DrainState
from service.servicers.batches import BatchServicer
from service.servicers.embeddings import EmbeddingServicer
from service.servicers.generation import GenerationServicer
from service.servicers.models import ModelServicer
from service.servicers.monitoring import MonitoringServicer
from service.servicers.ranking import RankingServicer
from service.servicers.responses import ResponseServicer
from service.servicers.scoring import ScoringServicer
from service.servicers.server_status import ServerServicer
from service.servicers.steering import SteeringServicer
from service.servicers.tokenization import TokenizationServicer
from service.state.opening import open_database
from service.steering.intensity import IntensityLimits
from service.steering.manager import SteeringManager
from service.steering.monitoring import MonitoringManager
from service.steering.replication import Follower
from service.steering.store import SteeringStore

log = logging.getLogger("millm.engine")

SERVICE_NAMES = (
    generation_service_pb2.DESCRIPTOR.services_by_name["GenerationService"].full_name,
    model_service_pb2.DESCRIPTOR.services_by_name["ModelService"].full_name,
    server_service_pb2.DESCRIPTOR.services_by_name["ServerService"].full_name,
    scoring_service_pb2.DESCRIPTOR.services_by_name["ScoringService"].full_name,
    embedding_service_pb2.DESCRIPTOR.services_by_name["EmbeddingService"].full_name,
    steering_service_pb2.DESCRIPTOR.services_by_name["SteeringService"].full_name,
    response_service_pb2.DESCRIPTOR.services_by_name["ResponseService"].full_name,
    monitoring_service_pb2.DESCRIPTOR.services_by_name["MonitoringService"].full_name,
    tokenization_service_pb2.DESCRIPTOR.services_by_name["TokenizationService"].full_name,
    ranking_service_pb2.DESCRIPTOR.services_by_name["RankingService"].full_name,
    batch_service_pb2.DESCRIPTOR.services_by_name["BatchService"].full_name,
)
# These need the model; model listing and status answer while it loads.
MODEL_BOUND_SERVICES = ("", SERVICE_NAMES[0], SERVICE_NAMES[3], SERVICE_NAMES[4],
                        SERVICE_NAMES[8], SERVICE_NAMES[9])
# Health entries that are no service (docs/deployment.md). state_store:
# SERVING while the state database is reachable and this replica has caught
# up with it. routable: SERVING while a model is loaded and no model change
# or drain runs, which is what a balancer over several replicas should check
# ("" stays SERVING through a model change, so that a lone engine still
# takes the request that asks it for another model).
STATE_STORE_HEALTH = "millm.state_store"
ROUTABLE_HEALTH = "millm.routable"

GRACE_SECONDS = 5.0
# Exit status when a model thread died (EX_SOFTWARE): the supervisor restarts us.
EXIT_MODEL_THREAD_DIED = 70


class EngineServer:
    def __init__(self, config: EngineConfig, keys: api_keys.KeyRing | None = None):
        self.config = config
        self.keys = keys
        # The engine's one state database: SQLite in the data dir, or the
        # PostgreSQL database its replicas share.
        self.database = open_database(config.database_url, config.data_dir)
        self.steering = SteeringManager(
            SteeringStore(self.database),
            config.saes_dir or config.models_dir / "saes",
            IntensityLimits(config.cluster_intensity_min, config.cluster_intensity_max,
                            config.circuit_intensity_min, config.circuit_intensity_max),
            config.control_vectors_dir or config.models_dir / "control_vectors",
        )
        self.monitoring = MonitoringManager(self.steering)
        self.inference = InferenceService(
            ModelRegistry(config.models_dir),
            lifecycle=LifecycleConfig(
                device=config.device,
                limits=SchedulerLimits(
                    max_batch=config.max_batch,
                    max_queued=config.max_queued,
                    max_rows_per_request=config.max_rows_per_request,
                    aging_s=config.admission_aging_s,
                    priority_reserve=config.priority_reserve,
                    stall_s=config.stream_stall_s,
                    prefill_chunk=config.prefill_chunk_tokens,
                    serial=config.batching == "serial",
                ),
                prefix_cache_tokens=config.prefix_cache_tokens,
                torch_linear=config.torch_linear,
                lock_model=config.lock_model,
                graceful_unload_timeout=config.graceful_unload_timeout,
                memory_headroom_bytes=config.memory_headroom_mib * 1024 * 1024,
                gguf_threads=config.gguf_threads,
                gguf_context=config.gguf_context,
                gguf_slots=config.gguf_slots,
                gguf_flash_attn=config.gguf_flash_attn,
                gguf_kv_f32=config.gguf_kv_f32,
                gguf_kv_memory_bytes=config.gguf_kv_memory_mib * 1024 * 1024,
            ),
            steering=self.steering,
            monitoring=self.monitoring,
        )
        self.responses = ResponseStore(self.database, Retention(
            config.responses_max_count, config.responses_max_age_days * 86_400))
        self.health = health.aio.HealthServicer()
        self.follower = Follower(self.steering, self.database, config.database_url,
                                 on_availability=self._set_state_store)
        self.drain = DrainState()
        self.metrics = EngineMetrics(self.inference, self.follower, self.monitoring)
        access = Access(keys, self.drain, self.metrics)
        self.server = grpc.aio.server(interceptors=[AccessInterceptor(access)],
                                      options=grpc_limits.server_options())
        generation_service_pb2_grpc.add_GenerationServiceServicer_to_server(
            GenerationServicer(self.inference, access), self.server
        )
        model_service_pb2_grpc.add_ModelServiceServicer_to_server(
            ModelServicer(self.inference), self.server
        )
        server_service_pb2_grpc.add_ServerServiceServicer_to_server(
            ServerServicer(self.inference, self.drain, self.follower.replicas.id), self.server
        )
        scoring_service_pb2_grpc.add_ScoringServiceServicer_to_server(
            ScoringServicer(self.inference), self.server
        )
        embedding_service_pb2_grpc.add_EmbeddingServiceServicer_to_server(
            EmbeddingServicer(self.inference), self.server
        )
        ranking_service_pb2_grpc.add_RankingServiceServicer_to_server(
            RankingServicer(Ranking(self.inference)), self.server
        )
        file_store = FileStore(self.database)
        batch_service_pb2_grpc.add_BatchServiceServicer_to_server(
            BatchServicer(file_store, BatchStore(self.database, file_store)), self.server
        )
        tokenization_service_pb2_grpc.add_TokenizationServiceServicer_to_server(
            TokenizationServicer(self.inference), self.server
        )
        steering_service_pb2_grpc.add_SteeringServiceServicer_to_server(
            SteeringServicer(self.steering, self.follower.replicas, self.inference), self.server
        )
        monitoring_service_pb2_grpc.add_MonitoringServiceServicer_to_server(
            MonitoringServicer(self.monitoring, self.inference), self.server
        )
        response_service_pb2_grpc.add_ResponseServiceServicer_to_server(
            ResponseServicer(self.responses), self.server
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server
        )
        self.port = 0
        # A model change (unload, switch, load) makes the replica unroutable
        # until it is done.
        self.inference.lifecycle.on_phase.append(
            lambda phase: asyncio.ensure_future(self._set_routable(phase == Phase.LOADED)))

    async def _set_routable(self, loaded: bool) -> None:
        serving = loaded and not self.drain.draining
        await self.health.set(ROUTABLE_HEALTH, health_pb2.HealthCheckResponse.SERVING
                              if serving else health_pb2.HealthCheckResponse.NOT_SERVING)

    async def _set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in MODEL_BOUND_SERVICES:
            await self.health.set(name, status)
        for name in SERVICE_NAMES:  # the rest answer whether a model is loaded or not
            if name not in MODEL_BOUND_SERVICES:
                await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def _set_state_store(self, available: bool) -> None:
        await self.health.set(STATE_STORE_HEALTH, health_pb2.HealthCheckResponse.SERVING
                              if available else health_pb2.HealthCheckResponse.NOT_SERVING)

    def _credentials(self) -> grpc.ServerCredentials | None:
        config = self.config
        if config.tls_cert is None:
            return None
        client_ca = config.tls_client_ca.read_bytes() if config.tls_client_ca else None
        return grpc.ssl_server_credentials(
            [(config.tls_key.read_bytes(), config.tls_cert.read_bytes())],
            root_certificates=client_ca, require_client_auth=client_ca is not None)

    async def start(self) -> None:
        torch.set_num_threads(self.config.torch_threads)
        credentials = self._credentials()
        if credentials is None:
            self.port = self.server.add_insecure_port(self.config.grpc_address)
        else:
            self.port = self.server.add_secure_port(self.config.grpc_address, credentials)
        if self.port == 0:
            raise RuntimeError(f"could not listen on {self.config.grpc_address}")
        await self._set_serving(False)
        await self._set_routable(False)
        await self._set_state_store(True)  # caught up: the snapshot was read just now
        self.follower.start()
        await self.server.start()
        tls = ("" if credentials is None else
               ", mutual TLS" if self.config.tls_client_ca else ", TLS")
        log.info("engine listening on %s:%d%s (loading %s)", self.config.host, self.port, tls,
                 self.config.model)
        if self.config.metrics_port:
            port = self.metrics.serve(self.config.host, self.config.metrics_port,
                                      None if self.config.metrics_open else self.keys,
                                      self._ready)
            log.info("engine metrics on http://%s:%d/metrics", self.config.host, port)

    def _ready(self) -> tuple[bool, dict]:
        """For the metrics port's /readyz (its own thread: reads, no awaits)."""
        loaded = self.inference.loaded
        serving = loaded is not None and not self.drain.draining
        return serving, {"model": loaded.id if loaded else None, "state_store":
                         "available" if self.follower.available else "unavailable"}

    async def load_startup_model(self) -> None:
        await self.inference.load(self.config.model)
        await self._set_serving(True)
        log.info("engine SERVING %s", self.config.model)

    async def drain_and_stop(self) -> None:
        """Stop taking work (UNAVAILABLE, health NOT_SERVING), let running calls
        finish for up to drain_seconds, then stop."""
        self.drain.draining = True
        for name in ("", *SERVICE_NAMES, ROUTABLE_HEALTH):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        deadline = asyncio.get_running_loop().time() + self.config.drain_seconds
        while self.drain.in_flight and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        if self.drain.in_flight:
            log.warning("drain time is up with %d calls running; stopping them",
                        self.drain.in_flight)
        await self.stop()

    async def die(self) -> None:
        """The model thread is gone: NOT_SERVING everywhere at once, then stop
        without waiting out the drain (nothing left can be served)."""
        self.drain.draining = True
        for name in ("", *SERVICE_NAMES, ROUTABLE_HEALTH):
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.stop(GRACE_SECONDS)
        self.metrics.stop()
        self.follower.stop()
        await self.follower.leave()
        self.database.close()

    async def stop(self) -> None:
        await self._set_serving(False)
        await self.server.stop(GRACE_SECONDS)
        self.metrics.stop()
        self.inference.shutdown()
        self.follower.stop()
        await self.follower.leave()
        self.database.close()


async def serve(config: EngineConfig) -> int:
    try:
        keys = api_keys.load_for_listener(config.host, log)
    except api_keys.KeyConfigError as exc:
        log.error("%s", exc)
        return 2
    engine = EngineServer(config, keys)
    await engine.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    died = asyncio.Event()
    model_thread.on_death(lambda: loop.call_soon_threadsafe(died.set))
    loader = asyncio.create_task(engine.load_startup_model())
    stopper = asyncio.create_task(stop.wait())
    dying = asyncio.create_task(died.wait())
    await asyncio.wait({loader, stopper, dying}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if loader.done() and loader.exception() is not None:
        log.error("could not load model %r: %s", config.model, loader.exception())
        code = 1
    elif loader.done():
        await asyncio.wait({stopper, dying}, return_when=asyncio.FIRST_COMPLETED)
    else:
        loader.cancel()
    if died.is_set():
        # Its requests were answered 503 already; a restart is the only cure.
        log.critical("a model thread died: NOT_SERVING, exiting for the supervisor to restart")
        await engine.die()
        return EXIT_MODEL_THREAD_DIED
    log.info("engine stopping")
    await engine.drain_and_stop()
    return code
