"""Qwen3-Coder (and Qwen3.5): Hermes' `<tool_call>` wrapper around XML, one
element per argument, strings raw and any other value as JSON:

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    2
    </parameter>
    </function>
    </tool_call>

The grammar is xgrammar's JSON-schema format in its "qwen_xml" style; the
arguments come back to the client as the JSON object they stand for
(`XmlArguments`), streamed one argument at a time."""

from __future__ import annotations

import json

from service.formats.base import ArgumentNotation, CallSyntax, Family

FUNCTION_END = "</function>"
PARAMETER, PARAMETER_END = "<parameter=", "</parameter>"


def detect(template: str, special_tokens: tuple[str, ...]) -> bool:
    return "<function=" in template and PARAMETER in template


def xml_text(arguments_json: str) -> str:
    """JSON arguments as the XML elements the model writes."""
    return "".join(f"{PARAMETER}{key}>\n{value if isinstance(value, str) else json.dumps(value)}"
                   f"\n{PARAMETER_END}\n" for key, value in json.loads(arguments_json).items())


class XmlArguments:
    """One call's XML arguments read character by character into JSON text:
    `feed` returns the JSON written for what completed (a whole argument, or
    the closing brace), and `done` turns true at `</function>`."""

    def __init__(self, schema: dict | None):
        self.properties = (schema or {}).get("properties") or {}
        self.buf, self.key, self.phase, self.count, self.done = "", "", "between", 0, False

    def feed(self, c: str) -> str:
        self.buf += c
        if self.phase == "between":
            head = self.buf.lstrip()
            if head == PARAMETER:
                self.phase, self.buf = "key", ""
            elif head == FUNCTION_END:
                self.done = True
                return "}" if self.count else "{}"
            elif head and not (PARAMETER.startswith(head) or FUNCTION_END.startswith(head)):
                raise ValueError("text between arguments")
        elif self.phase == "key":
            if c == ">":
                self.key, self.phase, self.buf = self.buf[:-1], "value", ""
        elif self.buf.endswith(PARAMETER_END):
            # Whitespace around a value is layout (the grammar's reading too).
            value = self.buf[:-len(PARAMETER_END)].strip()
            self.phase, self.buf = "between", ""
            self.count += 1
            lead = "{" if self.count == 1 else ", "
            return f"{lead}{json.dumps(self.key)}: {self._json(self.key, value)}"
        return ""

    def _json(self, key: str, value: str) -> str:
        if self.properties.get(key, {}).get("type") == "string":
            return json.dumps(value)
        try:
            return json.dumps(json.loads(value))
        except ValueError:  # raw text: a string
            return json.dumps(value)


class XmlNotation(ArgumentNotation):
    """The XML arguments as CallSyntax writes and reads them."""

    style, markup = "qwen_xml", (PARAMETER, PARAMETER_END, FUNCTION_END)

    def text(self, arguments_json: str, call_close: str) -> tuple[str, str]:
        # The last element's line ends before `</function>`: the close's own
        # newline is not written twice.
        return xml_text(arguments_json), call_close.removeprefix("\n")

    def reader(self, schema: dict | None, call_close: str) -> tuple[XmlArguments, str]:
        # The reader consumes `</function>` itself.
        return XmlArguments(schema), call_close[call_close.index(FUNCTION_END)
                                                + len(FUNCTION_END):]


CALLS = CallSyntax("qwen3_coder", call_open="<tool_call>\n<function=", name_close=">\n",
                   call_close=f"\n{FUNCTION_END}\n</tool_call>", separator="\n",
                   trigger="<tool_call>", arguments=XmlNotation())
FAMILY = Family("qwen3_coder", CALLS, None, detect,
                "the template writes `<function=` and `<parameter=`")
