// End-to-end: `thermocline serve` driven by the official OpenAI Node client (npm `openai` v6),
// exactly as an application written for the OpenAI API would use it.
// Usage: node --test openai.test.mjs   (THERMOCLINE_BIN and THERMOCLINE_TEST_MODELS set by run.sh)
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Ajv from 'ajv';

const BIN = process.env.THERMOCLINE_BIN;
const MODELS = process.env.THERMOCLINE_TEST_MODELS;
const MODEL = 'stories';
const KEY = 'e2e-secret';
const reference = JSON.parse(readFileSync(`${MODELS}/stories260K.reference.json`, 'utf8'));

let daemon;
let client;
let baseURL;

before(async () => {
  assert.ok(BIN, 'THERMOCLINE_BIN must name the thermocline binary');
  daemon = spawn(BIN, ['serve', '--model', `${MODELS}/stories260K.gguf=${MODEL}`, '--port', '0',
                       '--api-key', KEY, '--slots', '2'],
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
  baseURL = `http://127.0.0.1:${port}/v1`;
  for (let i = 0; i < 300; i++) {
    const r = await fetch(`http://127.0.0.1:${port}/health`).catch(() => null);
    if (r && r.status === 200) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  client = new OpenAI({ apiKey: KEY, baseURL, maxRetries: 0 });
});

after(async () => {
  if (!daemon || daemon.exitCode !== null) return;
  const exited = new Promise((resolve) => daemon.on('exit', (code) => resolve(code)));
  daemon.kill('SIGTERM');
  assert.equal(await exited, 0, 'the daemon exits 0 on SIGTERM');
});

test('models list and retrieve', async () => {
  const ids = [];
  for await (const m of client.models.list()) ids.push(m.id);
  assert.deepEqual(ids, [MODEL]);
  const m = await client.models.retrieve(MODEL);
  assert.equal(m.id, MODEL);
  assert.equal(m.object, 'model');
});

test('chat completion, not streamed', async () => {
  const c = await client.chat.completions.create({
    model: MODEL,
    messages: [{ role: 'system', content: 'Tell a story.' }, { role: 'user', content: 'Once upon a time' }],
    max_tokens: 32,
    temperature: 0,
  });
  assert.match(c.id, /^chatcmpl-/);
  assert.equal(c.object, 'chat.completion');
  assert.equal(c.model, MODEL);
  assert.equal(c.choices.length, 1);
  assert.equal(c.choices[0].message.role, 'assistant');
  assert.equal(typeof c.choices[0].message.content, 'string');
  assert.ok(c.choices[0].message.content.length > 0);
  assert.ok(['stop', 'length'].includes(c.choices[0].finish_reason));
  assert.equal(c.usage.total_tokens, c.usage.prompt_tokens + c.usage.completion_tokens);
});

test('chat completion streamed with include_usage equals the non-streamed one', async () => {
  const request = {
    model: MODEL,
    messages: [{ role: 'user', content: [{ type: 'text', text: 'Lily and Ben' }] }],
    max_tokens: 40,
    temperature: 0,
  };
  const whole = await client.chat.completions.create(request);
  const stream = await client.chat.completions.create({
    ...request, stream: true, stream_options: { include_usage: true },
  });
  let content = '';
  let role;
  let finish;
  let usage;
  let chunks = 0;
  let id;
  for await (const chunk of stream) {
    chunks++;
    assert.equal(chunk.object, 'chat.completion.chunk');
    id ??= chunk.id;
    assert.equal(chunk.id, id);  // one id per stream
    assert.match(chunk.id, /^chatcmpl-/);
    if (chunk.usage) {
      usage = chunk.usage;
      assert.equal(chunk.choices.length, 0);
      continue;
    }
    const choice = chunk.choices[0];
    if (choice.delta.role) role = choice.delta.role;
    if (choice.delta.content) content += choice.delta.content;
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  assert.ok(chunks > 3);
  assert.equal(role, 'assistant');
  assert.equal(content, whole.choices[0].message.content);
  assert.equal(finish, whole.choices[0].finish_reason);
  // The same prompt again: the prompt cache finds all of it but the last token in the slot
  // that answered the first request.
  const { prompt_tokens_details: details, ...counts } = usage;
  const { prompt_tokens_details: _, ...wholeCounts } = whole.usage;
  assert.deepEqual(counts, wholeCounts);
  assert.equal(details.cached_tokens, whole.usage.prompt_tokens - 1);
});

test('legacy completions give the reference greedy continuation', async () => {
  for (const p of reference.prompts.slice(0, 2)) {
    const c = await client.completions.create({
      model: MODEL, prompt: p.prompt, max_tokens: 48, temperature: 0,
    });
    assert.match(c.id, /^cmpl-/);
    assert.equal(c.object, 'text_completion');
    assert.equal(c.choices[0].text, p.full_text.slice(p.prompt.length));
    assert.equal(c.choices[0].finish_reason, 'length');
    assert.equal(c.usage.prompt_tokens, p.prompt_ids.length);
    assert.equal(c.usage.completion_tokens, 48);
  }
  const stream = await client.completions.create({
    model: MODEL, prompt: 'Once upon a time', max_tokens: 48, temperature: 0, stream: true,
  });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
  const p = reference.prompts[0];
  assert.equal(text, p.full_text.slice(p.prompt.length));
});

test('seeded sampling is reproducible', async () => {
  const sample = async (seed) => (await client.completions.create({
    model: MODEL, prompt: 'One day', max_tokens: 32, temperature: 1, top_p: 1, seed,
  })).choices[0].text;
  const a = await sample(1234);
  assert.equal(await sample(1234), a);
  const others = await Promise.all([1, 2, 3].map(sample));
  assert.ok(others.some((t) => t !== a), 'other seeds give other text');
});

test('stop strings are honoured', async () => {
  const c = await client.completions.create({
    model: MODEL, prompt: 'Once upon a time', max_tokens: 48, temperature: 0, stop: ['Lily'],
  });
  assert.equal(c.choices[0].text, ', there was a little girl named ');
  assert.equal(c.choices[0].finish_reason, 'stop');
});

test('errors surface as the client\'s typed exceptions', async () => {
  await assert.rejects(
    client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x' }] }),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && e.code === 'model_not_found');
  await assert.rejects(
    client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }], temperature: 5 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'temperature' &&
      e.type === 'invalid_request_error');
  await assert.rejects(
    client.completions.create({ model: MODEL, prompt: 'x', max_tokens: 100000 }),
    (e) => e instanceof OpenAI.BadRequestError && e.type === 'exceed_context_size_error');
  await assert.rejects(
    client.chat.completions.create({ model: MODEL, messages: [{ role: 'user', content: 'x' }], n: 3 }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'n');
  const stranger = new OpenAI({ apiKey: 'wrong', baseURL, maxRetries: 0 });
  await assert.rejects(stranger.models.list(),
    (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
});

// Constrained decoding makes even a story model write a valid call: the arguments parse and
// validate (ajv) against the function's parameters schema.
const weatherParameters = {
  type: 'object',
  properties: {
    city: { type: 'string', maxLength: 16 },
    unit: { enum: ['celsius', 'fahrenheit'] },
  },
  required: ['city', 'unit'],
  additionalProperties: false,
};
const tools = [
  { type: 'function',
    function: { name: 'get_weather', parameters: weatherParameters } },
  { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } },
];
// The story model's context is 512 tokens; a tool's schema costs ~150 of them in the prompt.
const ajv = new Ajv({ strict: true });
const validWeather = ajv.compile(weatherParameters);

test('tool_choice required gives tool_calls whose arguments validate against the schema', async () => {
  const c = await client.chat.completions.create({
    model: MODEL,
    messages: [{ role: 'user', content: 'What is the weather in Paris?' }],
    tools,
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
    max_tokens: 150,
    temperature: 0,
  });
  const choice = c.choices[0];
  assert.equal(choice.finish_reason, 'tool_calls');
  assert.equal(choice.message.content, null);
  assert.equal(choice.message.tool_calls.length, 1);
  const call = choice.message.tool_calls[0];
  assert.match(call.id, /^call_/);
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  const args = JSON.parse(call.function.arguments);
  assert.ok(validWeather(args), JSON.stringify(validWeather.errors));

  // "required": some function of the tools, with valid arguments; sampled, several seeds.
  for (const seed of [1, 2, 3]) {
    const r = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: 'user', content: 'Once upon a time' }],
      tools,
      tool_choice: 'required',
      max_tokens: 160,
      temperature: 1,
      seed,
    });
    const tc = r.choices[0].message.tool_calls;
    assert.equal(r.choices[0].finish_reason, 'tool_calls');
    assert.equal(tc.length, 1);
    const a = JSON.parse(tc[0].function.arguments);
    if (tc[0].function.name === 'get_weather') {
      assert.ok(validWeather(a), JSON.stringify(validWeather.errors));
    } else {
      assert.equal(tc[0].function.name, 'get_time');
      assert.deepEqual(a, {});
    }
  }

  // The call and its result go back as the next turn's history.
  const next = await client.chat.completions.create({
    model: MODEL,
    messages: [
      { role: 'user', content: 'What is the weather in Paris?' },
      choice.message,
      { role: 'tool', tool_call_id: call.id, content: '{"temperature": 21}' },
    ],
    tools,
    max_tokens: 16,
    temperature: 0,
  });
  assert.equal(typeof next.choices[0].message.content, 'string');
});

test('streamed tool_calls accumulate to the non-streamed call', async () => {
  const request = {
    model: MODEL,
    messages: [{ role: 'user', content: 'What is the weather in Oslo?' }],
    tools,
    tool_choice: { type: 'function', function: { name: 'get_weather' } },
    max_tokens: 150,
    temperature: 0,
  };
  const whole = await client.chat.completions.create(request);
  const stream = client.chat.completions.stream(request);
  let argumentChunks = 0;
  stream.on('tool_calls.function.arguments.delta', () => { argumentChunks++; });
  const final = await stream.finalChatCompletion();
  const call = final.choices[0].message.tool_calls[0];
  assert.equal(final.choices[0].finish_reason, 'tool_calls');
  assert.equal(call.function.name, 'get_weather');
  assert.match(call.id, /^call_/);
  assert.equal(call.function.arguments, whole.choices[0].message.tool_calls[0].function.arguments);
  assert.ok(validWeather(JSON.parse(call.function.arguments)));
  assert.ok(argumentChunks > 1, `arguments came in ${argumentChunks} chunks`);
});

test('response_format json_schema content validates against the schema', async () => {
  const schema = {
    type: 'object',
    properties: {
      name: { type: 'string', maxLength: 12 },
      age: { type: 'integer', minimum: 1, maximum: 99 },
      friends: { type: 'array', items: { type: 'string', maxLength: 8 }, maxItems: 2 },
      happy: { type: 'boolean' },
    },
    required: ['name', 'age', 'friends', 'happy'],
    additionalProperties: false,
  };
  const validate = ajv.compile(schema);
  for (const temperature of [0, 1]) {
    const c = await client.chat.completions.create({
      model: MODEL,
      messages: [{ role: 'user', content: 'Tell me about a girl.' }],
      response_format: { type: 'json_schema', json_schema: { name: 'person', schema, strict: true } },
      max_tokens: 300,
      temperature,
      seed: 5,
    });
    assert.equal(c.choices[0].finish_reason, 'stop');
    const value = JSON.parse(c.choices[0].message.content);
    assert.ok(validate(value), JSON.stringify(validate.errors));
  }
});

test('an unsupported schema keyword is refused by name', async () => {
  await assert.rejects(
    client.chat.completions.create({
      model: MODEL, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4,
      response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'number', multipleOf: 2 } } } }),
    (e) => e.status === 400 && /multipleOf/.test(e.message));
});
