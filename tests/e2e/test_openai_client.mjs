// End-to-end test with the official `openai` npm client against a real skippy server.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, mkdirSync, renameSync } from "node:fs";
import { execFileSync } from "node:child_process";
import path from "node:path";
import OpenAI from "openai";

const skippy = process.env.SKIPPY_BIN;
const modelsDir = process.env.SKIPPY_TEST_MODELS;
let server;
let client;
let modelId;

function ensureModel() {
  const file = path.join(modelsDir, "test-llama.gguf");
  if (!existsSync(file)) {
    mkdirSync(modelsDir, { recursive: true });
    const tmp = `${file}.tmp${process.pid}`;
    execFileSync(skippy, ["make-model", "--out", tmp, "--seed", "3", "--arch", "llama",
      "--layers", "2", "--embd", "128", "--heads", "4", "--ffn", "256"]);
    renameSync(tmp, file);
  }
  return file;
}

before(async () => {
  const model = ensureModel();
  server = spawn(skippy, ["serve", "--model", model, "--port", "0", "--threads", process.env.SKIPPY_TEST_THREADS ?? "1",
    "--api-key", "test-secret"], { stdio: ["ignore", "ignore", "pipe"] });
  const port = await new Promise((resolve, reject) => {
    let log = "";
    const timer = setTimeout(() => reject(new Error(`server did not start:\n${log}`)), 120000);
    server.stderr.on("data", (chunk) => {
      log += chunk;
      const m = log.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    server.on("exit", (code) => reject(new Error(`server exited ${code}:\n${log}`)));
  });
  client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "test-secret" });
  modelId = (await client.models.list()).data[0].id;
});

after(() => {
  server?.kill("SIGTERM");
});

const messages = [
  { role: "system", content: "You are a terse assistant." },
  { role: "user", content: "Name three colors." },
];

test("non-streaming chat completion", async () => {
  const res = await client.chat.completions.create({
    model: modelId, messages, max_tokens: 8, temperature: 0,
  });
  assert.equal(res.object, "chat.completion");
  assert.equal(res.choices.length, 1);
  assert.equal(res.choices[0].message.role, "assistant");
  assert.equal(typeof res.choices[0].message.content, "string");
  assert.ok(["stop", "length"].includes(res.choices[0].finish_reason));
  assert.equal(res.usage.total_tokens, res.usage.prompt_tokens + res.usage.completion_tokens);
  assert.ok(res.usage.completion_tokens <= 8);
});

test("streaming chat completion matches non-streaming", async () => {
  const full = await client.chat.completions.create({
    model: modelId, messages, max_tokens: 8, temperature: 0,
  });
  const stream = await client.chat.completions.create({
    model: modelId, messages, max_tokens: 8, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let text = "";
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.choices.length > 0) {
      text += chunk.choices[0].delta?.content ?? "";
      finish = chunk.choices[0].finish_reason ?? finish;
    }
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(text, full.choices[0].message.content);
  assert.equal(finish, full.choices[0].finish_reason);
  assert.deepEqual(usage, full.usage);
});

test("legacy completions endpoint", async () => {
  const res = await client.completions.create({
    model: modelId, prompt: "Once upon a time", max_tokens: 5, temperature: 0,
  });
  assert.equal(res.object, "text_completion");
  assert.equal(typeof res.choices[0].text, "string");
});

test("errors surface as APIError with status", async () => {
  await assert.rejects(
    client.chat.completions.create({ model: "no-such-model", messages }),
    (err) => err instanceof OpenAI.APIError && err.status === 404);
  const wrongKey = new OpenAI({ baseURL: client.baseURL, apiKey: "wrong" });
  await assert.rejects(wrongKey.models.list(),
    (err) => err instanceof OpenAI.AuthenticationError && err.status === 401);
});
