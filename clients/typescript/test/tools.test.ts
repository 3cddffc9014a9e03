// Tool calling without an engine: the request chatRequest() builds, and streamed
// fragments folded into whole calls.
import { test } from "node:test";
import assert from "node:assert/strict";
import {
  FinishReason, GenerateRequest, GenerateResponse, Generation, Role, ToolChoiceMode,
  chatRequest, foldToolCalls,
} from "../src/index";

const weather = { type: "object", properties: { city: { type: "string" } }, required: ["city"] };

test("chatRequest carries tools, tool_choice and tool messages", () => {
  const request = chatRequest("millm-tiny", [
    { role: "user", content: "Weather in Oslo?" },
    { role: "assistant", toolCalls: [{ id: "call_1", name: "get_weather", arguments: { city: "Oslo" } }] },
    { role: Role.ROLE_TOOL, toolCallId: "call_1", content: "12 C" },
  ], {
    tools: [{ name: "get_weather", description: "Weather now", parameters: weather },
      { name: "get_time", strict: true }],
    toolChoice: "required", parallelToolCalls: false, sampling: { maxTokens: 8 },
  });
  // What goes on the wire, read back.
  const sent = GenerateRequest.decode(GenerateRequest.encode(request).finish());
  const [first, second] = sent.tools;
  assert.equal(first.name, "get_weather");
  assert.equal(first.description, "Weather now");
  assert.deepEqual(JSON.parse(first.parametersJson), weather);
  assert.equal(first.strict, undefined);
  assert.deepEqual([second.parametersJson, second.strict], ["", true]);
  assert.deepEqual(sent.toolChoice, { mode: ToolChoiceMode.TOOL_CHOICE_MODE_REQUIRED, functionName: "" });
  assert.equal(sent.parallelToolCalls, false);
  assert.equal(sent.sampling?.maxTokens, 8);
  const [user, assistant, tool] = sent.chat?.messages ?? [];
  assert.equal(user.role, Role.ROLE_USER);
  assert.deepEqual(assistant.toolCalls, [{ id: "call_1", name: "get_weather", argumentsJson: '{"city":"Oslo"}' }]);
  assert.deepEqual([tool.role, tool.toolCallId, tool.content], [Role.ROLE_TOOL, "call_1", "12 C"]);

  const named = chatRequest("millm-tiny", [{ role: "user", content: "hi" }], { toolChoice: "get_weather" });
  assert.deepEqual(named.toolChoice, { mode: ToolChoiceMode.TOOL_CHOICE_MODE_FUNCTION, functionName: "get_weather" });
  const plain = chatRequest("millm-tiny", [{ role: "user", content: "hi" }]);
  assert.deepEqual([plain.tools, plain.toolChoice, plain.parallelToolCalls], [[], undefined, undefined]);
});

test("streamed tool-call fragments fold into whole calls", () => {
  const frag = (index: number, id = "", name = "", args = "") => ({ index, id, name, arguments: args });
  let calls = foldToolCalls([], [frag(0, "call_a", "get_weather"), frag(0, "", "", '{"city":')]);
  calls = foldToolCalls(calls, [frag(1, "call_b", "get_time", "{"), frag(0, "", "", '"Oslo"}'), frag(1, "", "", "}")]);
  assert.deepEqual(calls, [{ id: "call_a", name: "get_weather", arguments: '{"city":"Oslo"}' },
    { id: "call_b", name: "get_time", arguments: "{}" }]);
  assert.throws(() => foldToolCalls(calls, [frag(3, "call_d", "f")]), /index 3/);

  const generation = new Generation();
  for (const r of [
    { metadata: { id: "gen-1", model: "millm-tiny" }, choices: [{ index: 0, text: "Checking." }] },
    { choices: [{ index: 0, toolCalls: [frag(0, "call_a", "get_weather")] }] },
    { choices: [{ index: 0, toolCalls: [frag(0, "", "", "{}")], finishReason: FinishReason.FINISH_REASON_TOOL_CALLS }] },
  ]) generation.add(GenerateResponse.fromPartial(r));
  assert.equal(generation.id, "gen-1");
  assert.deepEqual(generation.texts, { 0: "Checking." });
  assert.deepEqual(generation.finishReasons, { 0: "tool_calls" });
  assert.deepEqual(generation.toolCalls, { 0: [{ id: "call_a", name: "get_weather", arguments: "{}" }] });
});
