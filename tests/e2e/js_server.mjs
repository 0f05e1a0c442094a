// Shared helpers of the JavaScript end-to-end tests: the generated test models (made by the
// ctest fixture through skippy_harness.py, or here when missing) and a real skippy server on
// a loopback port.
import { spawn, execFileSync } from "node:child_process";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));

export function modelPath(kind) {
  const out = execFileSync("python3", ["-c",
    `import skippy_harness as h; print(h.model_path(${JSON.stringify(kind)}))`],
  { cwd: here, env: process.env, encoding: "utf8" });
  return out.trim();
}

// Starts `skippy serve` on a free port; resolves to { port, stop() }. The disk tier is off
// unless the test turns it on (as in skippy_harness.py): tests running side by side never
// share, or read back, the default cache folder.
export async function startServer(model, extraArgs = []) {
  const proc = spawn(process.env.SKIPPY_BIN, ["serve", "--model", model, "--port", "0",
    "--threads", process.env.SKIPPY_TEST_THREADS ?? "1", ...extraArgs],
  { stdio: ["ignore", "ignore", "pipe"],
    env: { SKIPPY_CACHE_DISK: "off", ...process.env } });
  const port = await new Promise((resolve, reject) => {
    let log = "";
    const timer = setTimeout(() => reject(new Error(`server did not start:\n${log}`)), 120000);
    proc.stderr.on("data", (chunk) => {
      log += chunk;
      const m = log.match(/listening on http:\/\/[^:]+:(\d+)/);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    proc.on("exit", (code) => reject(new Error(`server exited ${code}:\n${log}`)));
  });
  proc.stderr.resume();
  const base = `http://127.0.0.1:${port}`;
  return {
    port,
    base,
    // Resolves once no lane is busy and no end-of-turn work is pending: a client that
    // sends its next turn while the previous turn's end still runs gets a shorter hit (the
    // waiting request goes first; see README "Exact prefix cache").
    idle: (apiKey) => waitIdle(base, apiKey),
    stop: () => new Promise((resolve) => {
      if (proc.exitCode !== null) return resolve();
      proc.on("exit", () => resolve());
      proc.kill("SIGTERM");
    }),
  };
}

async function waitIdle(base, apiKey, timeoutMs = 30000) {
  const headers = apiKey ? { authorization: `Bearer ${apiKey}` } : {};
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    const text = await (await fetch(`${base}/metrics`, { headers })).text();
    const value = (name) => Number(text.match(new RegExp(`^${name} (\\S+)$`, "m"))?.[1] ?? 0);
    if (value("skippy_turn_ends_deferred") === 0 && value("skippy_lanes_busy") === 0) return;
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error("server did not go idle");
}
