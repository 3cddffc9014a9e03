"""The stored responses: the store's retention and paging (unit), the engine's
ResponseService over gRPC, and on a stack of this module's own with API keys:
one key's responses are invisible to another (admin sees all), a stored
response survives an engine restart, and the GGUF engine serves
/v1/responses the same way."""

from __future__ import annotations

import json

import grpc
import openai
import pytest

from millm.v1 import generation_pb2, response_service_pb2_grpc
from millm.v1 import response_service_pb2 as rpb
from service.errors import EngineError
from service.responses import rules
from service.responses.store import ResponseStore, Retention
from tests import harness
from tests.conftest import MODEL
from tests.grpc_helpers import error_info

Q8 = "millm-tiny-gguf:Q8_0"

# -- the store and the paging rules -------------------------------------------------------


class Clock:
    def __init__(self):
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_retention_by_count_and_age(tmp_path):
    clock = Clock()
    store = ResponseStore(tmp_path / "state.sqlite3", Retention(max_count=3, max_age_s=100),
                          clock)
    for i in range(4):
        clock.now += 1
        store.save(f"resp_{i}", "alice", "{}", [(f"msg_{i}", "{}")])
    assert store.count() == 3 and store.get("resp_0", None) is None  # the oldest went
    assert store.items("resp_0") == []
    clock.now += 99  # resp_1 is now 100.x s old
    assert store.get("resp_1", None) is None and store.get("resp_3", None) is not None
    assert store.prune() == 1 and store.count() == 2
    with pytest.raises(KeyError):
        store.save("resp_3", "bob", "{}", [])
    store.close()
    again = ResponseStore(tmp_path / "state.sqlite3", Retention(3, 100), clock)
    assert again.get("resp_3", "alice").owner == "alice"  # durable
    assert again.get("resp_3", "bob") is None and not again.delete("resp_3", "bob")
    assert again.delete("resp_3", None) and again.get("resp_3", None) is None


def test_paging():
    ids = [f"i{k}" for k in range(5)]
    assert rules.page(ids, None, rules.DESC, "", "").positions == [4, 3, 2, 1, 0]
    first = rules.page(ids, 2, rules.ASC, "", "")
    assert (first.positions, first.has_more) == ([0, 1], True)
    last = rules.page(ids, 2, rules.ASC, "i2", "")
    assert (last.positions, last.has_more) == ([3, 4], False)
    assert rules.page(ids, 2, rules.DESC, "", "i1").positions == [3, 2]
    for bad in ({"limit": 0}, {"limit": 101}, {"after": "nope"}):
        with pytest.raises(EngineError) as caught:
            rules.page(ids, bad.get("limit", 2), rules.ASC, bad.get("after", ""), "")
        assert caught.value.param == next(iter(bad))


# -- ResponseService over gRPC (the session's engine, no keys) -----------------------------


def _message(item_id: str, text: str) -> rpb.ResponseItem:
    return rpb.ResponseItem(id=item_id, message=rpb.MessageItem(
        role=generation_pb2.ROLE_USER,
        content=[rpb.ContentPart(type=rpb.CONTENT_PART_TYPE_INPUT_TEXT, text=text)]))


@pytest.fixture(scope="module")
def responses_stub(channel):
    return response_service_pb2_grpc.ResponseServiceStub(channel)


def test_grpc_save_get_list_delete(responses_stub):
    response = rpb.StoredResponse(
        id="resp_grpc1", created_at=1700000000, model=MODEL,
        status=rpb.RESPONSE_STATUS_COMPLETED, metadata={"via": "grpc"},
        output=[rpb.ResponseItem(id="fc_1", status=rpb.ITEM_STATUS_COMPLETED,
                                 function_call=rpb.FunctionCallItem(
                                     call_id="call_1", name="f", arguments_json="{}"))])
    items = [_message(f"msg_{k}", f"turn {k}") for k in range(3)]
    reply = responses_stub.SaveResponse(rpb.SaveResponseRequest(response=response,
                                                                input_items=items))
    assert reply.pruned == 0
    got = responses_stub.GetResponse(rpb.GetResponseRequest(id="resp_grpc1",
                                                            include_input_items=True))
    assert got.response.output[0].function_call.call_id == "call_1"
    assert got.response.metadata["via"] == "grpc" and got.response.owner == ""
    assert [i.message.content[0].text for i in got.input_items] == ["turn 0", "turn 1",
                                                                    "turn 2"]
    page = responses_stub.ListInputItems(rpb.ListInputItemsRequest(response_id="resp_grpc1",
                                                                   limit=2))
    assert [i.id for i in page.items] == ["msg_2", "msg_1"] and page.has_more
    assert (page.first_id, page.last_id) == ("msg_2", "msg_1")
    with pytest.raises(grpc.RpcError) as caught:
        responses_stub.SaveResponse(rpb.SaveResponseRequest(response=response))
    assert caught.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert responses_stub.DeleteResponse(rpb.DeleteResponseRequest(id="resp_grpc1")).id == \
        "resp_grpc1"
    with pytest.raises(grpc.RpcError) as caught:
        responses_stub.GetResponse(rpb.GetResponseRequest(id="resp_grpc1"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert error_info(caught.value).reason == "response_not_found"


@pytest.mark.parametrize(("response", "items", "param"), [
    (rpb.StoredResponse(id="chatcmpl-1"), [], "response.id"),
    (rpb.StoredResponse(id="resp_m", metadata={f"k{i}": "v" for i in range(17)}), [],
     "metadata"),
    (rpb.StoredResponse(id="resp_d"), [_message("msg_a", "x"), _message("msg_a", "y")],
     "input_items[1].id"),
    (rpb.StoredResponse(id="resp_e"), [rpb.ResponseItem(id="msg_b")], "input_items[0]"),
    (rpb.StoredResponse(id="resp_p", previous_response_id="resp_missing"), [],
     "response.previous_response_id"),
])
def test_grpc_save_refusals_name_the_field(responses_stub, response, items, param):
    with pytest.raises(grpc.RpcError) as caught:
        responses_stub.SaveResponse(rpb.SaveResponseRequest(response=response,
                                                            input_items=items))
    assert error_info(caught.value).metadata["param"] == param


# -- keys, restart, GGUF (a stack of this module's own) ------------------------------------

ALICE, BOB, OPS = "alice-0123456789abcdef", "bob-0123456789abcdef-x", "ops-0123456789abcdef-x"
KEYS = json.dumps({"keys": [{"name": "alice", "scopes": ["inference"], "key": ALICE},
                            {"name": "bob", "scopes": ["inference"], "key": BOB},
                            {"name": "ops", "scopes": ["admin"], "key": OPS}]})


def _keyed(tmp) -> harness.OwnStack:
    return harness.OwnStack(tmp, {"MILLM_API_KEYS": KEYS}, MILLM_API_KEYS=KEYS)


@pytest.fixture(scope="module")
def keyed_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("responses-keyed")


@pytest.fixture(scope="module")
def keyed(keyed_dir):
    stack = _keyed(keyed_dir)
    yield stack
    stack.stop()


def _client(stack, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.base_url}/v1", api_key=key, max_retries=0,
                         timeout=120)


def test_a_response_is_visible_to_its_key_only(keyed):
    alice, bob, ops = (_client(keyed, k) for k in (ALICE, BOB, OPS))
    mine = alice.responses.create(model=MODEL, input="Alice's secret.", max_output_tokens=5)
    assert alice.responses.retrieve(mine.id).id == mine.id
    for attempt in (lambda: bob.responses.retrieve(mine.id),
                    lambda: bob.responses.input_items.list(mine.id),
                    lambda: bob.responses.delete(mine.id),
                    lambda: bob.responses.create(model=MODEL, input="and?",
                                                 previous_response_id=mine.id)):
        with pytest.raises(openai.NotFoundError) as caught:
            attempt()
        assert caught.value.body["code"] == "response_not_found"
    # An admin key sees every response; alice's is still there after bob's tries.
    assert ops.responses.retrieve(mine.id).output_text == mine.output_text
    assert alice.responses.input_items.list(mine.id).data[0].content[0].text == \
        "Alice's secret."
    # Over gRPC, the same rule with the same key.
    with grpc.insecure_channel(keyed.grpc_target) as channel:
        stub = response_service_pb2_grpc.ResponseServiceStub(channel)
        with pytest.raises(grpc.RpcError) as caught:
            stub.GetResponse(rpb.GetResponseRequest(id=mine.id),
                             metadata=(("authorization", f"Bearer {BOB}"),))
        assert error_info(caught.value).reason == "response_not_found"
        got = stub.GetResponse(rpb.GetResponseRequest(id=mine.id),
                               metadata=(("authorization", f"Bearer {ALICE}"),))
        assert got.response.owner == "alice"


def test_a_stored_response_survives_an_engine_restart(keyed, keyed_dir):
    alice = _client(keyed, ALICE)
    kept = alice.responses.create(model=MODEL, input="Keep this.", max_output_tokens=5)
    keyed.stop()
    restarted = _keyed(keyed_dir)  # the same data dir, a new engine and bridge
    try:
        alice = _client(restarted, ALICE)
        assert alice.responses.retrieve(kept.id).output_text == kept.output_text
        follow = alice.responses.create(model=MODEL, input="And then?", max_output_tokens=5,
                                        previous_response_id=kept.id)
        texts = [i.content[0].text for i in
                 alice.responses.input_items.list(follow.id, order="asc").data]
        assert texts == ["Keep this.", kept.output_text, "And then?"]
        with pytest.raises(openai.NotFoundError):
            _client(restarted, BOB).responses.retrieve(kept.id)
    finally:
        # The module fixture stops `keyed` (already stopped); this stack is ours.
        restarted.stop()


def test_gguf_serves_responses(tmp_path):
    stack = harness.OwnStack(tmp_path, MILLM_MODEL=Q8)
    try:
        client = _client(stack, "unused")
        r = client.responses.create(model=Q8, input="Hello!", max_output_tokens=40,
                                    extra_body={"seed": 1})
        assert r.model == Q8 and r.status in ("completed", "incomplete")
        assert r.output[0].type == "message"
        with client.responses.stream(model=Q8, input="Hi", max_output_tokens=10,
                                     previous_response_id=r.id) as stream:
            types = [e.type for e in stream]
        assert types[:2] == ["response.created", "response.in_progress"]
        assert types[-1] in ("response.completed", "response.incomplete")
        tool = {"type": "function", "name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
            "required": ["city"]}}
        called = client.responses.create(model=Q8, input="Weather in Paris?", tools=[tool],
                                         tool_choice={"type": "function",
                                                      "name": "get_weather"})
        [item] = called.output
        assert item.type == "function_call" and item.name == "get_weather"
        arguments = json.loads(item.arguments)
        assert isinstance(arguments["city"], str) and len(arguments["city"]) <= 20
        client.responses.delete(r.id)
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(r.id)
    finally:
        stack.stop()
