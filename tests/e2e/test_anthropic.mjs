// The @anthropic-ai/sdk client against skippy's POST /v1/messages: plain and tool-use
// messages, streamed and not, a tool_result turn, and Anthropic-style errors.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";
import { modelPath, startServer } from "./js_server.mjs";

let server;
let client;

const tools = [{
  name: "get_weather",
  description: "Current weather in a city",
  input_schema: {
    type: "object",
    properties: {
      city: { type: "string", enum: ["Paris", "Oslo", "Lima"] },
      days: { type: "integer", minimum: 1, maximum: 7 },
    },
    required: ["city", "days"],
    additionalProperties: false,
  },
}];
const ask = [{ role: "user", content: "What is the weather in Paris?" }];

before(async () => {
  server = await startServer(modelPath("llama-tools"),
    ["--lanes", "2", "--ctx-size", "8192", "--api-key", "sk-ant-test", "--alias", "claude-sonnet-4-5"]);
  client = new Anthropic({ baseURL: server.base, apiKey: "sk-ant-test" });
});

after(async () => {
  await server?.stop();
});

function checkToolUse(block) {
  assert.equal(block.type, "tool_use");
  assert.equal(block.name, "get_weather");
  assert.ok(block.id);
  assert.deepEqual(Object.keys(block.input).sort(), ["city", "days"]);
  assert.ok(["Paris", "Oslo", "Lima"].includes(block.input.city));
  assert.ok(Number.isInteger(block.input.days));
}

test("a text message", async () => {
  const msg = await client.messages.create({
    model: "claude-sonnet-4-5", max_tokens: 8, temperature: 0, system: "Be brief.", messages: ask,
  });
  assert.equal(msg.type, "message");
  assert.equal(msg.role, "assistant");
  assert.equal(msg.content[0].type, "text");
  assert.ok(["end_turn", "max_tokens"].includes(msg.stop_reason));
  assert.ok(msg.usage.output_tokens <= 8);
});

test("tool use, non-streamed and streamed alike, then a tool_result turn", async () => {
  const body = {
    model: "claude-sonnet-4-5", max_tokens: 300, temperature: 0, messages: ask, tools,
    tool_choice: { type: "tool", name: "get_weather", disable_parallel_tool_use: true },
  };
  const msg = await client.messages.create(body);
  assert.equal(msg.stop_reason, "tool_use");
  assert.equal(msg.content.length, 1);
  checkToolUse(msg.content[0]);

  const stream = client.messages.stream(body);
  const events = [];
  stream.on("streamEvent", (e) => events.push(e.type));
  const streamed = await stream.finalMessage();
  assert.equal(streamed.stop_reason, "tool_use");
  checkToolUse(streamed.content[0]);
  assert.deepEqual(streamed.content[0].input, msg.content[0].input);
  assert.equal(events[0], "message_start");
  assert.ok(events.includes("content_block_start"));
  assert.ok(events.includes("content_block_delta"));
  assert.equal(events.at(-1), "message_stop");

  await server.idle("sk-ant-test");
  const next = await client.messages.create({
    model: "claude-sonnet-4-5", max_tokens: 8, temperature: 0, tools,
    messages: [...ask, { role: "assistant", content: msg.content },
      { role: "user", content: [{ type: "tool_result", tool_use_id: msg.content[0].id,
        content: "sunny" }] }],
  });
  assert.ok(["end_turn", "max_tokens", "tool_use"].includes(next.stop_reason));
  // The previous turn was restored from the cache.
  assert.ok(next.usage.cache_read_input_tokens >= msg.usage.input_tokens
    + msg.usage.cache_read_input_tokens);
});

test("errors are Anthropic errors", async () => {
  await assert.rejects(client.messages.create({
    model: "claude-sonnet-4-5", max_tokens: 8, messages: ask, tools,
    tool_choice: { type: "tool", name: "no_such_tool" },
  }), (err) => err instanceof Anthropic.BadRequestError && err.status === 400
    && err.error?.type === "error" && err.error?.error?.type === "invalid_request_error");
  await assert.rejects(client.messages.create({
    model: "claude-sonnet-4-5", max_tokens: 8,
    messages: [{ role: "user", content: [{ type: "image", source: { type: "url", url: "x" } }] }],
  }), (err) => err instanceof Anthropic.BadRequestError);
  const wrong = new Anthropic({ baseURL: server.base, apiKey: "wrong" });
  await assert.rejects(wrong.messages.create({ model: "claude-sonnet-4-5", max_tokens: 8, messages: ask }),
    (err) => err instanceof Anthropic.AuthenticationError && err.error?.error?.type === "authentication_error");
  await assert.rejects(client.messages.create({ model: "claude-opus-9", max_tokens: 8, messages: ask }),
    (err) => err instanceof Anthropic.NotFoundError);
  // Still serving.
  const msg = await client.messages.create({ model: "claude-sonnet-4-5", max_tokens: 2, messages: ask });
  assert.equal(msg.type, "message");
});
