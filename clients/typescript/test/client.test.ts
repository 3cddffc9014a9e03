// Runs against a live engine at MILLM_TEST_TARGET (tests/test_clients.py starts one).
import { test } from "node:test";
import assert from "node:assert/strict";
import { MillmClient, MillmError, Role } from "../src/index";

const target = process.env.MILLM_TEST_TARGET ?? "127.0.0.1:50051";
const hello = { chat: { messages: [{ role: Role.ROLE_USER, content: "Hello!" }] } };

test("a unary call lists the models", async () => {
  const client = new MillmClient(target);
  const reply = await client.listModels({ timeout: 10 });
  assert.ok(reply.models.some((m) => m.id === "millm-tiny"));
  client.close();
});

test("a streamed generation", async () => {
  const client = new MillmClient(target);
  const responses = [];
  for await (const r of client.generate({ model: "millm-tiny", ...hello, sampling: { maxTokens: 6 } },
    { timeout: 30, requestId: "ts-1" })) {
    responses.push(r);
  }
  assert.equal(responses[0].metadata?.model, "millm-tiny");
  const text = responses.flatMap((r) => r.choices.map((c) => c.text)).join("");
  assert.ok(text.length > 0);
  assert.ok((responses.at(-1)?.usage?.completionTokens ?? 0) > 0);
  client.close();
});

test("a refusal carries the OpenAI code from ErrorInfo", async () => {
  const client = new MillmClient(target);
  await assert.rejects(async () => {
    for await (const _ of client.generate({ model: "millm-tiny", ...hello, sampling: { temperature: 5 } })) {
      // nothing arrives
    }
  }, (error: unknown) => {
    assert.ok(error instanceof MillmError);
    assert.equal(error.code, "invalid_parameter");
    assert.equal(error.param, "temperature");
    assert.equal(error.httpStatus, 400);
    assert.equal(error.status, 3); // INVALID_ARGUMENT
    return true;
  });
  client.close();
});

test("tokenize and detokenize round-trip a conversation", async () => {
  const client = new MillmClient(target);
  const reply = await client.tokenize({ model: "millm-tiny", ...hello, returnTokenStrs: true }, { timeout: 30 });
  assert.equal(reply.count, reply.tokens.length);
  assert.deepEqual(reply.tokenStrs.slice(0, 2), ["<|im_start|>", "user"]);
  const text = await client.detokenize("millm-tiny", reply.tokens, { timeout: 30 });
  assert.equal(text, "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
  client.close();
});

test("an id outside the vocabulary is refused by its index", async () => {
  const client = new MillmClient(target);
  await assert.rejects(client.detokenize("millm-tiny", [1, 10_000_000]), (error: unknown) => {
    assert.ok(error instanceof MillmError);
    assert.equal(error.code, "invalid_parameter");
    assert.equal(error.param, "tokens[1]");
    return true;
  });
  client.close();
});
