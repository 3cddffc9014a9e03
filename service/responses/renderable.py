"""What a stored response must be for every reader to render it.

SaveResponse takes protobuf from any gRPC caller, not only the bridge, and
the bridge renders what GetResponse returns as OpenAI JSON. A value the
contract can carry but no reader can show would be stored and then break
every later read of that response (a 500 on `GET /v1/responses/{id}`), so it
is refused at the save instead, as a 400 naming the field:

- an enum number the contract does not define (`status = 97`): a reader
  built from the same contract has no name for it;
- a float that is NaN or infinite: JSON has no spelling for it;
- a `*_json` string (a tool's parameters, a schema, a call's arguments) that
  is not standard JSON (NaN and Infinity included), or is nested deeper than
  a request body may be (service/json_text.py). The one exception is the
  arguments of a call whose item is incomplete (max_output_tokens cut it
  mid-arguments): a read shows arguments as the string they are, and a
  response continued from it meets requests/tools.py's check_history, a
  400; refusing them here made the save of an honest incomplete response a
  400 naming a field the client never sent.

The check walks the message by its descriptor, so a field added to the
contract later is covered without a change here.
"""

from __future__ import annotations

import math

from google.protobuf.descriptor import FieldDescriptor

from millm.v1 import response_service_pb2 as response_pb2
from service import json_text
from service.errors import invalid_parameter

_FLOATS = (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT)


def check(message, where: str) -> None:
    """Refuse the first value of `message` (named from `where`) that a reader
    could not render."""
    cut = (isinstance(message, response_pb2.ResponseItem)
           and message.status == response_pb2.ITEM_STATUS_INCOMPLETE
           and message.HasField("function_call"))
    for field, value in message.ListFields():
        if cut and field.name == "function_call":
            _cut_call(value, f"{where}.{field.name}" if where else field.name)
            continue
        name = f"{where}.{field.name}" if where else field.name
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value_field = field.message_type.fields_by_name["value"]
            for key, item in value.items():
                _one(value_field, item, f"{name}.{key}")
        elif field.is_repeated:
            for i, item in enumerate(value):
                _one(field, item, f"{name}[{i}]")
        else:
            _one(field, value, name)


def _one(field: FieldDescriptor, value, name: str) -> None:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        check(value, name)
    elif field.type == FieldDescriptor.TYPE_ENUM:
        if field.enum_type.values_by_number.get(value) is None:
            raise invalid_parameter(name, f"'{name}' is {value}, which is not a value of "
                                    f"{field.enum_type.name}.")
    elif field.type in _FLOATS:
        if not math.isfinite(value):
            raise invalid_parameter(name, f"'{name}' must be a finite number.")
    elif field.type == FieldDescriptor.TYPE_STRING and field.name.endswith("_json") and value:
        reason = json_problem(value)
        if reason is not None:
            raise invalid_parameter(name, f"'{name}' is not JSON: {reason}.")


def _cut_call(call, where: str) -> None:
    """A call cut mid-arguments: everything but its arguments is checked."""
    for field, value in call.ListFields():
        if field.name != "arguments_json":
            _one(field, value, f"{where}.{field.name}")


def json_problem(text: str) -> str | None:
    """Why `text` is not JSON that any reader parses and writes back, or None."""
    try:
        json_text.loads(text)
    except ValueError as exc:
        return str(exc)
    return None
