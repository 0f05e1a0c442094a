// The @openai/agents SDK running a multi-turn tool loop against skippy, through both the
// Chat Completions and the Responses API: the agent calls a function tool on every turn
// (tool_choice required), gets its results back, and stops after the third call. Later
// turns restore the previous turn from the prefix cache.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import OpenAI from "openai";
import {
  Agent, run, tool, setTracingDisabled, OpenAIChatCompletionsModel, OpenAIResponsesModel,
} from "@openai/agents";
import { z } from "zod";
import { modelPath, startServer } from "./js_server.mjs";

let server;
let client;

before(async () => {
  setTracingDisabled(true);
  server = await startServer(modelPath("llama-tools"),
    ["--lanes", "2", "--ctx-size", "16384", "--cache-min-tokens", "16", "--alias", "gpt-4.1,*"]);
  client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: "unused" });
});

after(async () => {
  await server?.stop();
});

function makeAgent(model, calls) {
  const weather = tool({
    name: "get_weather",
    description: "Current weather in a city",
    parameters: z.object({
      city: z.enum(["Paris", "Oslo", "Lima"]),
      days: z.number().int().min(1).max(7),
    }),
    execute: async ({ city, days }) => {
      calls.push({ city, days });
      return `${city}: sunny for ${days} days`;
    },
  });
  return new Agent({
    name: "forecaster",
    instructions: "Answer weather questions with the get_weather tool.",
    model,
    tools: [weather],
    modelSettings: { toolChoice: "required", temperature: 0, maxTokens: 300, parallelToolCalls: false },
    resetToolChoice: false,
    // Stop after the third tool result: three model turns, each with a call.
    toolUseBehavior: (_context, results) => (calls.length >= 3
      ? { isFinalOutput: true, isInterrupted: undefined, finalOutput: results.map((r) => r.output).join("; ") }
      : { isFinalOutput: false, isInterrupted: undefined }),
  });
}

for (const [api, Model] of [["chat completions", OpenAIChatCompletionsModel],
  ["responses", OpenAIResponsesModel]]) {
  test(`multi-turn tool loop through the ${api} API`, async () => {
    const calls = [];
    const agent = makeAgent(new Model(client, "gpt-4.1"), calls);
    const result = await run(agent, "What is the weather in Paris for the next days?", { maxTurns: 6 });
    assert.equal(calls.length, 3);
    for (const call of calls) {
      assert.ok(["Paris", "Oslo", "Lima"].includes(call.city));
      assert.ok(Number.isInteger(call.days) && call.days >= 1 && call.days <= 7);
    }
    assert.match(String(result.finalOutput), /sunny/);
    // Each model call after the first restored the previous one from the cache.
    const usage = result.rawResponses.map((r) => r.usage);
    assert.equal(usage.length, 3);
    for (let i = 1; i < usage.length; ++i) {
      const cached = usage[i].inputTokensDetails?.[0]?.cached_tokens
        ?? usage[i].inputTokensDetails?.cached_tokens ?? 0;
      assert.ok(cached >= 0.9 * usage[i - 1].inputTokens,
        `turn ${i}: ${cached} cached of ${usage[i - 1].inputTokens}`);
    }
  });
}
