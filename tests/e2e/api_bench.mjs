// Benchmark (not a test): decode tokens/s through the API for one streaming client, next to
// `thermocline bench` on the same model and thread count.
// usage: node api_bench.mjs PATH/TO/thermocline MODEL.gguf [threads=1] [gen_tokens=64] [reps=5]
// Decode rate = (tokens - 1) / (time of the last token chunk - time of the first), so prefill
// and time to first token are left out, as `thermocline bench` leaves them out.
import { execFileSync, spawn } from 'node:child_process';

const [bin, model, threads = '1', genArg = '64', repsArg = '5'] = process.argv.slice(2);
const gen = Number(genArg);
const reps = Number(repsArg);
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];

const daemon = spawn(bin, ['serve', '--model', `${model}=m`, '--port', '0', '--threads', threads,
                           '--log-level', 'warn'], { stdio: ['ignore', 'pipe', 'inherit'] });
const port = await new Promise((resolve) => {
  let out = '';
  daemon.stdout.on('data', (d) => {
    out += d;
    const m = out.match(/:(\d+)\n/);
    if (m) resolve(Number(m[1]));
  });
});
for (;;) {
  const r = await fetch(`http://127.0.0.1:${port}/health`).catch(() => null);
  if (r?.status === 200) break;
  await new Promise((r) => setTimeout(r, 20));
}
// A 64-token prompt, as `thermocline bench` uses.
const prompt = Array.from({ length: 63 }, (_, i) => 10 + (i * 7) % 400);

async function run() {
  const res = await fetch(`http://127.0.0.1:${port}/v1/completions`, {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ model: 'm', prompt: [1, ...prompt], max_tokens: gen, temperature: 0,
                           ignore_eos: true, stream: true }),
  });
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  let tokens = 0;
  let first = 0;
  let last = 0;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf('\n\n')) >= 0) {
      const ev = buf.slice(6, i);
      buf = buf.slice(i + 2);
      if (ev === '[DONE]') continue;
      const j = JSON.parse(ev);
      if (j.choices[0].finish_reason) continue;
      const now = performance.now();
      if (tokens === 0) first = now;
      last = now;
      tokens++;
    }
  }
  return (tokens - 1) / ((last - first) / 1000);
}

// API and bench runs interleaved, so that both see the same machine load.
const benchOnce = () => JSON.parse(execFileSync(bin, [
  'bench', '-m', model, '--threads', threads, '--gen-tokens', String(gen), '--prompt-tokens', '64',
  '--repetitions', '1', '--json'], { encoding: 'utf8' })).decode_tokens_per_s;
await run();  // warm-up
const api = [];
const bench = [];
for (let r = 0; r < reps; r++) {
  api.push(await run());
  bench.push(benchOnce());
}
daemon.kill('SIGTERM');
const round = (x) => Math.round(x * 10) / 10;
console.log(JSON.stringify({
  model, threads: Number(threads), gen_tokens: gen, reps,
  api_decode_tokens_per_s: { median: round(median(api)), best: round(Math.max(...api)) },
  bench_decode_tokens_per_s: { median: round(median(bench)), best: round(Math.max(...bench)) },
  ratio_median: Math.round((median(api) / median(bench)) * 1000) / 1000,
  ratio_best: Math.round((Math.max(...api) / Math.max(...bench)) * 1000) / 1000,
}));
