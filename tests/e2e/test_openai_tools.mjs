// The official `openai` npm client against skippy with a tool-capable generated model:
// tools (non-streamed and streamed), tool_choice required and named, parallel calls,
// json_schema response format and logprobs.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import { modelPath, startServer } from "./js_server.mjs";

let server;
let client;
let model;

const tools = [
  {
    type: "function",
    function: {
      name: "get_weather",
      description: "Current weather in a city",
      parameters: {
        type: "object",
        properties: {
          city: { type: "string", enum: ["Paris", "Oslo", "Lima"] },
          days: { type: "integer", minimum: 1, maximum: 7 },
        },
        required: ["city", "days"],
        additionalProperties: false,
      },
    },
  },
  {
    type: "function",
    function: {
      name: "search",
      description: "Search the web",
      parameters: {
        type: "object",
        properties: { query: { type: "string", maxLength: 12 }, safe: { type: "boolean" } },
        required: ["query", "safe"],
        additionalProperties: false,
      },
    },
  },
];
const messages = [
  { role: "system", content: "You can call tools." },
  { role: "user", content: "What is the weather in Paris for three days?" },
];

function checkArgs(call) {
  const args = JSON.parse(call.function.arguments);
  if (call.function.name === "get_weather") {
    assert.deepEqual(Object.keys(args).sort(), ["city", "days"]);
    assert.ok(["Paris", "Oslo", "Lima"].includes(args.city));
    assert.ok(Number.isInteger(args.days) && args.days >= 1 && args.days <= 7);
  } else {
    assert.equal(call.function.name, "search");
    assert.deepEqual(Object.keys(args).sort(), ["query", "safe"]);
    assert.ok(typeof args.query === "string" && args.query.length <= 12);
    assert.equal(typeof args.safe, "boolean");
  }
}

before(async () => {
  server = await startServer(modelPath("llama-tools"), ["--lanes", "2", "--ctx-size", "8192"]);
  client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: "unused" });
  model = (await client.models.list()).data[0].id;
});

after(async () => {
  await server?.stop();
});

test("tool_choice required: a valid call, non-streamed", async () => {
  const res = await client.chat.completions.create({
    model, messages, tools, tool_choice: "required", parallel_tool_calls: false,
    temperature: 0, max_tokens: 300,
  });
  const choice = res.choices[0];
  assert.equal(choice.finish_reason, "tool_calls");
  assert.equal(choice.message.content, null);
  assert.equal(choice.message.tool_calls.length, 1);
  const call = choice.message.tool_calls[0];
  assert.equal(call.type, "function");
  assert.match(call.id, /^call_/);
  checkArgs(call);
});

test("named tool_choice calls that function", async () => {
  for (const name of ["search", "get_weather"]) {
    const res = await client.chat.completions.create({
      model, messages, tools, parallel_tool_calls: false, temperature: 0, max_tokens: 300,
      tool_choice: { type: "function", function: { name } },
    });
    const calls = res.choices[0].message.tool_calls;
    assert.equal(calls.length, 1);
    assert.equal(calls[0].function.name, name);
    checkArgs(calls[0]);
  }
});

test("streamed tool calls: the client's accumulated message equals the non-streamed one", async () => {
  const body = {
    model, messages, tools, tool_choice: "required", parallel_tool_calls: false,
    temperature: 0, max_tokens: 300,
  };
  const full = await client.chat.completions.create(body);
  const runner = client.chat.completions.stream({ ...body, stream: true });
  const final = await runner.finalChatCompletion();
  const got = final.choices[0].message.tool_calls;
  const want = full.choices[0].message.tool_calls;
  assert.equal(final.choices[0].finish_reason, "tool_calls");
  assert.deepEqual(got.map((c) => [c.function.name, c.function.arguments]),
    want.map((c) => [c.function.name, c.function.arguments]));
  assert.match(got[0].id, /^call_/);
});

test("parallel tool calls", async () => {
  const res = await client.chat.completions.create({
    model, messages, tools, tool_choice: "required", parallel_tool_calls: true,
    temperature: 0, max_tokens: 600,
  });
  let calls = res.choices[0].message.tool_calls;
  if (res.choices[0].finish_reason === "length") calls = calls.slice(0, -1);
  assert.ok(calls.length >= 2, `expected several calls, got ${calls.length}`);
  calls.forEach(checkArgs);
  assert.equal(new Set(calls.map((c) => c.id)).size, calls.length);
});

test("tool results in the history", async () => {
  const first = await client.chat.completions.create({
    model, messages, tools, tool_choice: "required", parallel_tool_calls: false,
    temperature: 0, max_tokens: 300,
  });
  const msg = first.choices[0].message;
  // An agent runs the tool before it answers; by then the server has prefilled the end of
  // the turn. (A follow-up sent at once restores only what the exactness rule lets it take
  // of the previous prompt, and prefills the reply again.)
  await server.idle();
  const res = await client.chat.completions.create({
    model, tools, tool_choice: "none", temperature: 0, max_tokens: 8,
    messages: [...messages, msg,
      { role: "tool", tool_call_id: msg.tool_calls[0].id, content: "sunny" }],
  });
  assert.equal(typeof res.choices[0].message.content, "string");
  assert.ok(res.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens,
    `cached ${res.usage.prompt_tokens_details.cached_tokens} of ${res.usage.prompt_tokens}, ` +
    `the first prompt had ${first.usage.prompt_tokens}`);
});

test("json_schema response format", async () => {
  const schema = {
    type: "object",
    properties: { answer: { type: "string", enum: ["yes", "no"] },
      confidence: { type: "integer", minimum: 0, maximum: 9 } },
    required: ["answer", "confidence"],
    additionalProperties: false,
  };
  const res = await client.chat.completions.create({
    model, temperature: 0, max_tokens: 200,
    messages: [{ role: "user", content: "Is the sky blue?" }],
    response_format: { type: "json_schema", json_schema: { name: "verdict", strict: true, schema } },
  });
  const value = JSON.parse(res.choices[0].message.content);
  assert.ok(["yes", "no"].includes(value.answer));
  assert.ok(Number.isInteger(value.confidence));
  await assert.rejects(client.chat.completions.create({
    model, messages,
    response_format: { type: "json_schema", json_schema: { name: "x", schema: {
      type: "object", properties: { n: { type: "number", maximum: 3 } } } } },
  }), (err) => err instanceof OpenAI.BadRequestError && err.status === 400);
});

test("logprobs", async () => {
  const res = await client.chat.completions.create({
    model, messages, temperature: 0, max_tokens: 5, logprobs: true, top_logprobs: 2,
  });
  const content = res.choices[0].logprobs.content;
  assert.equal(content.length, res.usage.completion_tokens);
  for (const entry of content) {
    assert.ok(entry.logprob <= 0);
    assert.equal(entry.top_logprobs.length, 2);
    assert.ok(Array.isArray(entry.bytes));
  }
  const stream = await client.chat.completions.create({
    model, messages, temperature: 0, max_tokens: 5, logprobs: true, top_logprobs: 2, stream: true,
  });
  const streamed = [];
  for await (const chunk of stream) {
    for (const c of chunk.choices) streamed.push(...(c.logprobs?.content ?? []));
  }
  assert.deepEqual(streamed.map((e) => e.token), content.map((e) => e.token));
});
