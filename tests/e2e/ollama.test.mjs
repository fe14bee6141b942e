// End-to-end: `thermocline serve` driven by the official Ollama JavaScript client (npm `ollama`)
// unchanged, as a desktop app written for Ollama would use it: chat (streamed and not),
// generate, list, show, ps and embed; and the official OpenAI client's embeddings.create against
// /v1/embeddings on the same daemon.
// Usage: node --test ollama.test.mjs   (THERMOCLINE_BIN and THERMOCLINE_TEST_MODELS set by run.sh)
import { spawn } from 'node:child_process';
import { readFileSync, statSync } from 'node:fs';
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { Ollama } from 'ollama';
import OpenAI from 'openai';

const BIN = process.env.THERMOCLINE_BIN;
const MODELS = process.env.THERMOCLINE_TEST_MODELS;
const MODEL = 'stories';
const KEY = 'e2e-secret';
const reference = JSON.parse(readFileSync(`${MODELS}/stories260K.reference.json`, 'utf8'));

let daemon;
let ollama;
let openai;

before(async () => {
  assert.ok(BIN, 'THERMOCLINE_BIN must name the thermocline binary');
  daemon = spawn(BIN, ['serve', '--model', `${MODELS}/stories260K.gguf=${MODEL}`, '--port', '0',
                       '--grpc-port', 'off', '--api-key', KEY, '--slots', '2'],
                 { stdio: ['ignore', 'pipe', 'inherit'] });
  const port = await new Promise((resolve, reject) => {
    let out = '';
    daemon.stdout.on('data', (d) => {
      out += d;
      const m = out.match(/listening on http:\/\/127\.0\.0\.1:(\d+)/);
      if (m) resolve(Number(m[1]));
    });
    daemon.on('exit', (code) => reject(new Error(`daemon exited with ${code}`)));
    setTimeout(() => reject(new Error('daemon did not start')), 30000).unref();
  });
  for (let i = 0; i < 300; i++) {
    const r = await fetch(`http://127.0.0.1:${port}/health`).catch(() => null);
    if (r && r.status === 200) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  ollama = new Ollama({ host: `http://127.0.0.1:${port}`, headers: { Authorization: `Bearer ${KEY}` } });
  openai = new OpenAI({ apiKey: KEY, baseURL: `http://127.0.0.1:${port}/v1`, maxRetries: 0 });
});

after(async () => {
  if (!daemon || daemon.exitCode !== null) return;
  const exited = new Promise((resolve) => daemon.on('exit', (code) => resolve(code)));
  daemon.kill('SIGTERM');
  assert.equal(await exited, 0, 'the daemon exits 0 on SIGTERM');
});

const norm = (v) => Math.sqrt(v.reduce((s, x) => s + x * x, 0));
const maxDiff = (a, b) => Math.max(...a.map((x, i) => Math.abs(x - b[i])));

test('list and show', async () => {
  const list = await ollama.list();
  assert.deepEqual(list.models.map((m) => m.name), [`${MODEL}:latest`]);
  const m = list.models[0];
  assert.equal(m.size, statSync(`${MODELS}/stories260K.gguf`).size);
  assert.equal(m.details.format, 'gguf');
  assert.equal(m.details.family, 'llama');
  assert.equal(m.details.quantization_level, 'F32');
  assert.ok(!Number.isNaN(new Date(m.modified_at).getTime()));
  const show = await ollama.show({ model: `${MODEL}:latest` });
  assert.equal(show.details.family, 'llama');
  assert.equal(show.model_info['general.architecture'], 'llama');
  assert.equal(show.model_info['llama.context_length'], 512);
  assert.ok(show.model_info['general.parameter_count'] > 200000);
  assert.match(show.modelfile, /FROM /);
});

test('generate: greedy text equals the reference', async () => {
  const p = reference.prompts[0];
  const r = await ollama.generate({
    model: MODEL, prompt: p.prompt, raw: true, stream: false,
    options: { temperature: 0, num_predict: 48 },
  });
  assert.equal(r.response, p.full_text.slice(p.prompt.length));
  assert.equal(r.done, true);
  assert.equal(r.done_reason, 'length');
  assert.equal(r.prompt_eval_count, p.prompt_ids.length);
  assert.equal(r.eval_count, 48);
  assert.ok(r.total_duration > 0 && r.eval_duration > 0 && r.prompt_eval_duration > 0);
  // Streamed: the pieces add up to the same text.
  let text = '';
  let last;
  for await (const part of await ollama.generate({
    model: MODEL, prompt: p.prompt, raw: true, stream: true,
    options: { temperature: 0, num_predict: 48 },
  })) {
    text += part.response;
    last = part;
  }
  assert.equal(text, r.response);
  assert.equal(last.done, true);
  assert.equal(last.eval_count, 48);
});

test('chat, not streamed and streamed, give the same answer', async () => {
  const request = {
    model: MODEL,
    messages: [{ role: 'system', content: 'Tell a story.' }, { role: 'user', content: 'Once upon a time' }],
    options: { temperature: 0, num_predict: 24 },
  };
  const one = await ollama.chat({ ...request, stream: false });
  assert.equal(one.message.role, 'assistant');
  assert.ok(one.message.content.length > 0);
  assert.equal(one.done, true);
  assert.equal(one.eval_count, 24);
  let text = '';
  let parts = 0;
  for await (const part of await ollama.chat({ ...request, stream: true })) {
    text += part.message.content;
    parts += 1;
    if (part.done) assert.equal(part.done_reason, 'length');
  }
  assert.ok(parts > 2, 'streamed in several parts');
  assert.equal(text, one.message.content);
});

test('errors reach the client as Ollama errors', async () => {
  await assert.rejects(ollama.chat({ model: 'llama3', messages: [{ role: 'user', content: 'hi' }], stream: false }),
                       (e) => e.status_code === 404 && /llama3/.test(e.error));
  await assert.rejects(ollama.generate({ model: MODEL, prompt: 'hi', format: 'yaml', stream: false }),
                       (e) => e.status_code === 400 && /format/.test(e.error));
});

test('chat with a JSON schema format: the content parses and has the required key', async () => {
  const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 12 } }, required: ['name'] };
  const r = await ollama.chat({ model: MODEL, messages: [{ role: 'user', content: 'Who is Lily?' }],
                                format: schema, stream: false, options: { temperature: 0, num_predict: 80 } });
  assert.equal(r.done_reason, 'stop');
  const person = JSON.parse(r.message.content);
  assert.equal(typeof person.name, 'string');
  assert.ok(person.name.length <= 12);
});

test('embed: unit vectors, identical in, identical out, different in, different out', async () => {
  const e = await ollama.embed({ model: MODEL, input: ['Once upon a time', 'The cat', 'Once upon a time'] });
  assert.equal(e.embeddings.length, 3);
  const [a, b, c] = e.embeddings;
  assert.equal(a.length, 64);
  assert.ok(Math.abs(norm(a) - 1) < 1e-5);
  assert.ok(Math.abs(norm(b) - 1) < 1e-5);
  assert.deepEqual(a, c);
  assert.ok(maxDiff(a, b) > 1e-2);
  const ps = await ollama.ps();
  assert.deepEqual(ps.models.map((m) => m.name), [`${MODEL}:latest`]);
});

test('openai embeddings.create: floats, base64, pooling', async () => {
  const input = 'Once upon a time';
  const floats = await openai.embeddings.create({ model: MODEL, input, encoding_format: 'float' });
  const v = floats.data[0].embedding;
  assert.equal(v.length, 64);
  assert.ok(Math.abs(norm(v) - 1) < 1e-5);
  assert.equal(floats.usage.prompt_tokens, reference.prompts[0].prompt_ids.length);
  // The same vector as Ollama's route.
  const viaOllama = await ollama.embed({ model: MODEL, input });
  assert.deepEqual(viaOllama.embeddings[0], v);
  // base64: the client decodes it into the same float32 values.
  const b64 = await openai.embeddings.create({ model: MODEL, input, encoding_format: 'base64' });
  const raw = b64.data[0].embedding;
  assert.equal(typeof raw, 'string', 'base64 asked for explicitly stays a string');
  const bytes = Buffer.from(raw, 'base64');
  const decoded = Array.from(new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4));
  assert.deepEqual(decoded, v.map(Math.fround));
  // Without encoding_format the client asks for base64 and decodes it itself.
  const dflt = await openai.embeddings.create({ model: MODEL, input });
  assert.deepEqual(dflt.data[0].embedding, v.map(Math.fround));
  const two = await openai.embeddings.create({ model: MODEL, input: [input, 'The cat sat'], encoding_format: 'float' });
  assert.deepEqual(two.data[0].embedding, v);
  assert.ok(maxDiff(two.data[1].embedding, v) > 1e-2);
  const last = await openai.embeddings.create({ model: MODEL, input, encoding_format: 'float', pooling: 'last' });
  assert.ok(Math.abs(norm(last.data[0].embedding) - 1) < 1e-5);
  assert.ok(maxDiff(last.data[0].embedding, v) > 1e-2);
});
