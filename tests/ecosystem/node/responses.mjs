// The OpenAI Node SDK's Responses API against miLLM (tests/test_ecosystem.py).
// argv: the bridge's base URL (ending in /v1), the model. Runs
// responses.create, then responses.stream continuing it (previous_response_id),
// then a forced function call, and prints one JSON line of what came back.
import OpenAI from "openai";

const [baseURL, model] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 120_000 });

const created = await client.responses.create({
  model, input: "Hello!", max_output_tokens: 40, seed: 10,
});

const events = [];
const stream = client.responses.stream({
  model, input: "And then?", max_output_tokens: 20, previous_response_id: created.id,
});
for await (const event of stream) events.push({ type: event.type, seq: event.sequence_number });
const streamed = await stream.finalResponse();

const called = await client.responses.create({
  model, input: "What is the weather in Paris?", store: false,
  tools: [{
    type: "function", name: "get_weather", strict: true,
    parameters: {
      type: "object", properties: { city: { type: "string", maxLength: 24 } },
      required: ["city"], additionalProperties: false,
    },
  }],
  tool_choice: { type: "function", name: "get_weather" },
});
const items = await client.responses.inputItems.list(streamed.id, { order: "asc" });

console.log(JSON.stringify({
  created: { id: created.id, status: created.status, output_text: created.output_text },
  streamed: { id: streamed.id, status: streamed.status, output_text: streamed.output_text,
              previous_response_id: streamed.previous_response_id },
  events,
  call: called.output.map((item) => ({ type: item.type, name: item.name,
                                       arguments: item.arguments })),
  input_items: items.data.map((item) => ({ type: item.type, role: item.role })),
}));
