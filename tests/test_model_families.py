"""Architecture conformance: every model family we claim to serve, served by
the real engine and compared with transformers run directly.

One engine process holds a models dir of tiny random checkpoints, one per
family (service/demo_model/families.py), and switches between them as the
tests name them (tests run family by family, so each loads once). For each
family: greedy text alone and inside a busy batch equals `generate()`, with
prompts longer than any sliding window; scoring and echo log-probabilities
equal a forward pass; steering hooks attach and change the output exactly as a
hook added by hand does; SAE readout reads what the layer computed; the chat
template renders (a template without a system role gets the system text in
the first user turn). A checkpoint the engine cannot serve is refused when it
is named, with a named error.
"""

from __future__ import annotations

import shutil

import grpc
import pytest
import torch

from millm.v1 import (
    generation_pb2,
    generation_service_pb2_grpc,
    model_service_pb2,
    model_service_pb2_grpc,
    scoring_service_pb2,
    scoring_service_pb2_grpc,
    server_service_pb2_grpc,
    steering_pb2,
    steering_service_pb2,
    steering_service_pb2_grpc,
)
from service.demo_model import families
from tests import harness
from tests.families_reference import Reference, demo_sae, sae_encode
from tests.grpc_helpers import (
    MaxRunningRows,
    chat_request,
    concurrently,
    error_info,
    prompt_request,
    run,
)

TOL = 1e-5
L1 = "sae_millm-tiny-res-l1"
FEATURE, STRENGTH = 3, 48.0
PROMPTS = [
    "The lighthouse keeper wrote in his journal every night, and the river ran past the "
    "old mill where the cats sleep most of the day. In the morning the baker opened his "
    "shop, the children walked to school, and the fishing boats went out to sea.",
    "A",
    "Cats sleep most of the day. They find a warm spot by the window and",
    "The river ran past the mill, under the bridge, beside the road to town, and on to",
    "Tell me a story about the sea.",
]
NOT_SERVED = "tiny-t5"


class Engine:
    def __init__(self, process, port):
        self.process, self.channel = process, grpc.insecure_channel(f"127.0.0.1:{port}")
        self.generation = generation_service_pb2_grpc.GenerationServiceStub(self.channel)
        self.scoring = scoring_service_pb2_grpc.ScoringServiceStub(self.channel)
        self.models = model_service_pb2_grpc.ModelServiceStub(self.channel)
        self.steering = steering_service_pb2_grpc.SteeringServiceStub(self.channel)
        self.server = server_service_pb2_grpc.ServerServiceStub(self.channel)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    target = tmp_path_factory.mktemp("family-models")
    demo = harness.models_dir()
    families.build_all(demo / "millm-tiny", target)
    shutil.copytree(demo / "saes", target / "saes")
    # An encoder-decoder checkpoint: no causal language model to generate with.
    from transformers import T5Config, T5ForConditionalGeneration

    T5ForConditionalGeneration(T5Config(d_model=32, d_ff=64, num_layers=1, num_heads=2,
                                        d_kv=16, vocab_size=768)).save_pretrained(
        target / NOT_SERVED)
    return target


@pytest.fixture(scope="module")
def engine(models, tmp_path_factory):
    process, port = harness.start_engine(tmp_path_factory.mktemp("families"),
                                         MILLM_MODELS_DIR=str(models),
                                         MILLM_MODEL=families.FAMILIES[0].model_id)
    try:
        harness.wait_serving(process, port)
        engine = Engine(process, port)
        # Attached once: the engine re-attaches it to every model it fits.
        engine.steering.AttachSae(steering_service_pb2.AttachSaeRequest(sae_id=L1))
        engine.steering.CreateProfile(steering_service_pb2.CreateProfileRequest(
            name="push", entries=[steering_pb2.SteeringEntry(layer=1, feature=FEATURE,
                                                             strength=STRENGTH)]))
        yield engine
    finally:
        process.stop()


@pytest.fixture(scope="module", params=families.FAMILIES, ids=lambda f: f.name)
def family(request, engine, models):
    fam = request.param
    engine.models.LoadModel(model_service_pb2.LoadModelRequest(id=fam.model_id), timeout=120)
    return fam, Reference(fam, models / fam.model_id), engine


def generated(engine, request) -> dict[int, list[int]]:
    return run(engine.generation, request)[2]


def greedy_request(fam, text: str, tokens: int, **extra):
    return prompt_request(text, model=fam.model_id, max_tokens=tokens, temperature=0,
                          ignore_eos=True, **extra)


def test_the_prompts_run_past_every_sliding_window(family):
    fam, ref, _ = family
    longest = max(len(ref.ids(p)) for p in PROMPTS)
    assert longest > 2 * families.SLIDING_WINDOW
    if fam.sliding_window is not None:
        assert ref.model.config.sliding_window == fam.sliding_window


def test_greedy_text_alone_equals_generate(family):
    fam, ref, engine = family
    for text in PROMPTS[:2]:
        assert generated(engine, greedy_request(fam, text, 24)) == {
            0: ref.greedy(ref.ids(text), 24)}


def test_greedy_text_in_a_busy_batch_equals_generate(family):
    fam, ref, engine = family
    requests = [greedy_request(fam, text, 10 + 4 * i, n=2 if i == 2 else 1)
                for i, text in enumerate(PROMPTS)]
    with MaxRunningRows(engine.server) as rows:
        answers = concurrently(engine.generation, requests, stagger=0.03, tokens=True)
    assert rows.value >= 2  # the rows really shared forward passes
    for i, (text, answer) in enumerate(zip(PROMPTS, answers, strict=True)):
        expected = ref.greedy(ref.ids(text), 10 + 4 * i)
        assert answer == ({0: expected, 1: expected} if i == 2 else {0: expected})


def test_a_repeated_prompt_reuses_its_prefix_where_the_cache_allows(family):
    fam, ref, engine = family
    text = PROMPTS[0] + " Again."
    first = run(engine.generation, greedy_request(fam, text, 6))
    second = run(engine.generation, greedy_request(fam, text, 6))
    assert first[2] == second[2] == {0: ref.greedy(ref.ids(text), 6)}
    # LFM2's convolution state sums up the whole prefix: nothing to resume from.
    recurrent = fam.name == "lfm2"
    assert (second[4].cached_tokens > 0) is not recurrent


def test_scoring_and_echo_equal_a_forward_pass(family):
    fam, ref, engine = family
    text = PROMPTS[3]
    ids = ref.ids(text)
    expected = ref.log_softmax(ids)
    scored = engine.scoring.Score(scoring_service_pb2.ScoreRequest(
        model=fam.model_id, prompt=generation_pb2.PromptInput(
            prompts=[generation_pb2.Prompt(text=text)]), top_logprobs=3))
    top = scored.choices[0].next.top
    best = torch.topk(expected[-1], 3)
    assert [t.token_id for t in top] == best.indices.tolist()
    for entry, value in zip(top, best.values.tolist(), strict=True):
        assert abs(entry.logprob - value) < TOL

    request = prompt_request(text, model=fam.model_id, max_tokens=0, logprobs=1)
    request.prompt.echo = True
    echoed = run(engine.generation, request)[5][1].echoed[0].tokens
    assert [t.token.token_id for t in echoed] == ids
    assert not echoed[0].token.HasField("logprob")
    for p in range(1, len(ids)):
        assert abs(echoed[p].token.logprob - float(expected[p - 1, ids[p]])) < TOL


def test_steering_changes_the_output_as_a_hook_on_its_layer_would(family, models):
    fam, ref, engine = family
    messages = [{"role": "user", "content": PROMPTS[2]}]
    ids = ref.chat_ids(messages)
    request = chat_request(PROMPTS[2], model=fam.model_id, max_tokens=12, temperature=0,
                           ignore_eos=True)
    plain = generated(engine, request)
    request.profile = "push"
    steered = generated(engine, request)
    _, weights = demo_sae(models / "saes" / "millm-tiny-res-l1")
    delta = STRENGTH * weights["W_dec"][FEATURE]
    assert plain == {0: ref.greedy(ids, 12)}
    assert steered == {0: ref.greedy(ids, 12, delta=delta, layer=1)}
    assert steered != plain
    # The hooks sit on the family's own list of decoder layers, wherever it lives.
    assert f"{fam.model_id}: steering hooks on {fam.layers_path} " in engine.process.log()


def test_sae_readout_reads_the_layer_output(family, models):
    fam, ref, engine = family
    text = PROMPTS[0]
    ids = ref.ids(text)
    request = greedy_request(fam, text, 2)
    request.return_sae_activations.CopyFrom(steering_pb2.SaeActivationsRequest(
        sae_id=L1, top_k=3, selector=steering_pb2.POSITION_SELECTOR_PROMPT))
    responses = run(engine.generation, request)[5]
    read = [r.sae_activations for r in responses if r.HasField("sae_activations")][0]
    assert read.layer == 1 and [p.position for p in read.positions] == list(range(len(ids)))
    acts = sae_encode(models / "saes" / "millm-tiny-res-l1", ref.residual(ids, layer=1))
    for entry in read.positions:
        best = torch.topk(acts[entry.position], 3)
        expected = [(int(i), float(v)) for v, i in zip(best.values, best.indices, strict=True)
                    if v > 0]
        assert [f.index for f in entry.features] == [i for i, _ in expected]
        for f, (_, value) in zip(entry.features, expected, strict=True):
            assert abs(f.value - value) < 1e-4


def test_the_chat_template_renders_with_and_without_a_system_role(family):
    fam, ref, engine = family
    system, user = "You answer in one short sentence.", PROMPTS[4]
    request = chat_request(user, model=fam.model_id, max_tokens=8, temperature=0,
                           ignore_eos=True)
    request.chat.messages.insert(0, generation_pb2.ChatMessage(
        role=generation_pb2.ROLE_SYSTEM, content=system))
    _, _, tokens, _, usage, _ = run(engine.generation, request)
    if fam.system_role:
        ids = ref.chat_ids([{"role": "system", "content": system},
                            {"role": "user", "content": user}])
    else:
        # Its own template refuses a system turn; the engine folds it in.
        with pytest.raises(Exception, match="System role not supported"):
            ref.chat_ids([{"role": "system", "content": system},
                          {"role": "user", "content": user}])
        ids = ref.chat_ids([{"role": "user", "content": f"{system}\n\n{user}"}])
    assert usage.prompt_tokens == len(ids)
    assert tokens == {0: ref.greedy(ids, 8)}


def test_a_checkpoint_that_cannot_be_served_is_refused_when_named(engine):
    with pytest.raises(grpc.RpcError) as caught:
        run(engine.generation, chat_request("Hi", model=NOT_SERVED, max_tokens=2))
    info = error_info(caught.value)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (info.reason, info.metadata["param"]) == ("unsupported_architecture", "model")
    assert "(t5)" in caught.value.details()
    listed = engine.models.ListModels(model_service_pb2.ListModelsRequest()).models
    assert "(t5)" in next(m for m in listed if m.id == NOT_SERVED).error



def test_the_cache_each_layout_needs_is_known_before_the_weights_load():
    """kv.check_servable reads only the config: True for a recurrent state
    (no prefix cache), False for attention alone, and a refusal naming the
    layer kind for a cache the lanes cannot hold (DeepSeek V3.2's indexer)."""
    from transformers import AutoConfig

    from service.engines.transformers import kv
    from service.errors import EngineError

    lfm2, gemma2 = families.by_name("lfm2"), families.by_name("gemma2")
    assert kv.check_servable(AutoConfig.for_model("lfm2", **lfm2.config)) is True
    assert kv.check_servable(AutoConfig.for_model("gemma2", **gemma2.config)) is False
    with pytest.raises(EngineError) as caught:
        kv.check_servable(AutoConfig.for_model("deepseek_v32", num_hidden_layers=2))
    assert caught.value.code == "unsupported_architecture"
    assert "DynamicIndexedLayer" in caught.value.message
