// SPDX-License-Identifier: MIT
// tests/openai_sdk.js - the official OpenAI Node SDK (npm `openai`) against a running
// `dpshard serve` of stories260K, for tests/openai_sdk.sh. The SDK must parse every response
// without error; the texts must be the one-process model's (`dpshard generate`, greedy, no
// ranks, no HTTP), run here for each request with the prompt length the server reported:
//   - completions.create and chat.completions.create, without and with streaming, the
//     streams with stream_options.include_usage: the deltas concatenate to the oracle's text,
//     every chunk but the last has "usage": null, the last has no choices and the usage of
//     the non-streamed response; system_fingerprint on every response and chunk, the same;
//   - models.list names the served model and models.retrieve(id) returns it; another id is
//     the SDK's NotFoundError (404);
//   - a field dpshard refuses (a stream of echo with logprobs, best_of other than n,
//     response_format) is the SDK's APIError with status 400 and the field's name in its
//     message; n, echo and logprobs parse, and echo with logprobs and max_tokens 0 gives the
//     prompt's entries;
//   - a wrong oracle text is reported (the check can fail).
//   node openai_sdk.js NPM_DIR PORT DPSHARD MODEL_DIR
'use strict';
const path = require('path');
const { execFileSync } = require('child_process');

const [npmDir, port, dpshard, modelDir] = process.argv.slice(2);
const mod = require(path.resolve(npmDir, 'node_modules', 'openai'));
const OpenAI = mod.OpenAI || mod.default || mod;
const model = path.basename(modelDir);

let failures = 0;
function check(cond, msg) {
  if (!cond) {
    console.log('FAIL: ' + msg);
    failures++;
  }
  return cond;
}

// The one-process model's greedy continuation: -n counts the prompt's positions (BOS
// included), so prompt_tokens + max_tokens - 1 steps make max_tokens new tokens. generate
// prints the prompt and its continuation (with --chat, only the reply) and a newline.
function oracle(prompt, promptTokens, maxTokens, chat) {
  const args = ['generate', '--model', modelDir, '--cpu-bind', 'off', '--temperature', '0',
    '-n', String(promptTokens + maxTokens - 1)];
  if (chat)
    args.push('--chat');
  args.push(prompt);
  let out = execFileSync(dpshard, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  if (out.endsWith('\n'))
    out = out.slice(0, -1);
  if (!chat) {
    check(out.startsWith(prompt), 'generate did not echo the prompt: ' + JSON.stringify(out));
    out = out.slice(prompt.length);
  }
  return out;
}

function same(label, got, want) {
  return check(got === want, label + ': ' + JSON.stringify(got) + ' != the one-process model\'s ' +
    JSON.stringify(want));
}

// Consumes a stream: its text, and checks of usage and system_fingerprint on each chunk.
async function drain(label, stream, chat) {
  const chunks = [];
  for await (const c of stream)
    chunks.push(c);
  check(chunks.length >= 2, label + ': ' + chunks.length + ' chunks');
  const last = chunks[chunks.length - 1];
  let text = '';
  let fp = null;
  chunks.forEach((c, i) => {
    check(typeof c.system_fingerprint === 'string' && c.system_fingerprint.length > 0,
      label + ': chunk ' + i + ' has no system_fingerprint');
    fp = fp || c.system_fingerprint;
    check(c.system_fingerprint === fp, label + ': the system_fingerprint changed');
    if (i < chunks.length - 1) {
      check(c.usage === null, label + ': chunk ' + i + ' has usage ' + JSON.stringify(c.usage));
      for (const ch of c.choices)
        text += (chat ? ch.delta.content : ch.text) || '';
    }
  });
  check(last.choices.length === 0 && last.usage && last.usage.completion_tokens > 0,
    label + ': the last chunk is not the usage chunk: ' + JSON.stringify(last));
  return { text, usage: last.usage, fp };
}

async function refused(label, fn, field) {
  try {
    await fn();
    check(false, label + ': accepted');
  } catch (e) {
    check(e instanceof mod.APIError && e.status === 400 && e.message.includes(field),
      label + ': not an APIError 400 naming ' + field + ': ' + e + ' (status ' + e.status + ')');
  }
}

async function main() {
  const client = new OpenAI({ baseURL: 'http://127.0.0.1:' + port + '/v1', apiKey: 'none',
    maxRetries: 0, timeout: 120000 });
  const prompt = 'Once upon a time';
  const n = 24;

  // completions, not streamed, then streamed with include_usage
  const c = await client.completions.create({ model, prompt, max_tokens: n, temperature: 0 });
  const fp = c.system_fingerprint;
  check(typeof fp === 'string' && fp.length > 0, 'completion: no system_fingerprint');
  check(c.object === 'text_completion' && c.choices.length === 1, 'completion: ' +
    JSON.stringify(c));
  const want = oracle(prompt, c.usage.prompt_tokens, c.usage.completion_tokens, false);
  same('completion', c.choices[0].text, want);
  check(c.usage.completion_tokens === n && c.choices[0].finish_reason === 'length',
    'completion: ' + JSON.stringify(c.usage) + ' ' + c.choices[0].finish_reason);
  const cs = await drain('completion stream', await client.completions.create({ model, prompt,
    max_tokens: n, temperature: 0, stream: true, stream_options: { include_usage: true } }),
  false);
  same('completion stream', cs.text, want);
  check(JSON.stringify(cs.usage) === JSON.stringify(c.usage), 'completion stream: usage ' +
    JSON.stringify(cs.usage) + ' != ' + JSON.stringify(c.usage));
  check(cs.fp === fp, 'completion stream: another system_fingerprint');

  // chat, through the model's chat template
  const messages = [{ role: 'user', content: prompt }];
  const ch = await client.chat.completions.create({ model, messages, max_tokens: n,
    temperature: 0 });
  check(ch.object === 'chat.completion' && ch.choices[0].message.role === 'assistant',
    'chat: ' + JSON.stringify(ch));
  check(ch.system_fingerprint === fp, 'chat: another system_fingerprint');
  const wantChat = oracle(prompt, ch.usage.prompt_tokens, ch.usage.completion_tokens, true);
  same('chat', ch.choices[0].message.content, wantChat);
  const chs = await drain('chat stream', await client.chat.completions.create({ model,
    messages, max_tokens: n, temperature: 0, stream: true,
    stream_options: { include_usage: true } }), true);
  same('chat stream', chs.text, wantChat);
  check(JSON.stringify(chs.usage) === JSON.stringify(ch.usage), 'chat stream: usage ' +
    JSON.stringify(chs.usage) + ' != ' + JSON.stringify(ch.usage));

  // models
  const list = [];
  for await (const m of client.models.list())
    list.push(m.id);
  check(list.includes(model), 'models.list: ' + JSON.stringify(list));
  const one = await client.models.retrieve(model);
  check(one.id === model && one.object === 'model', 'models.retrieve: ' + JSON.stringify(one));
  try {
    await client.models.retrieve('no-such-model');
    check(false, 'models.retrieve of another id succeeded');
  } catch (e) {
    check(e instanceof mod.NotFoundError && e.status === 404, 'models.retrieve of another id: ' +
      e);
  }

  // refused fields: APIError 400 naming the field
  await refused('a stream of echo with logprobs', () => client.completions.create({ model,
    prompt, echo: true, logprobs: 1, stream: true }), '"stream"');
  // echo with logprobs, as lm-evaluation-harness asks for a prompt's log-likelihood: the
  // prompt's entries first, the first of them null (tests/serve_oai.py checks the values)
  const ll = await client.completions.create({ model, prompt, echo: true, logprobs: 1,
    max_tokens: 0 });
  const llp = ll.choices[0].logprobs;
  check(ll.choices[0].text === prompt && llp.token_logprobs[0] === null &&
    llp.token_logprobs.length === ll.usage.prompt_tokens &&
    llp.token_logprobs.slice(1).every((v) => typeof v === 'number' && v <= 0),
    'echo with logprobs and max_tokens 0: ' + JSON.stringify(ll.choices[0]).slice(0, 300));
  await refused('best_of', () => client.completions.create({ model, prompt, n: 2, best_of: 3 }),
    '"best_of"');
  // n, echo and logprobs are served: the SDK parses them (tests/serve_oai.py checks values)
  const n2 = await client.completions.create({ model, prompt, n: 2, echo: true, max_tokens: 4,
    temperature: 0 });
  check(n2.choices.length === 2 && n2.choices[1].index === 1 &&
    n2.choices[0].text.startsWith(prompt), 'n = 2 with echo: ' + JSON.stringify(n2.choices));
  const lp = await client.chat.completions.create({ model, messages, max_tokens: 3,
    temperature: 0, logprobs: true, top_logprobs: 2 });
  check(lp.choices[0].logprobs.content.length >= 1 &&
    lp.choices[0].logprobs.content[0].top_logprobs.length === 2,
    'chat logprobs: ' + JSON.stringify(lp.choices[0].logprobs));
  await refused('response_format', () => client.chat.completions.create({ model, messages,
    response_format: { type: 'json_object' } }), 'response_format');

  // the check can fail: a wrong oracle is reported
  const before = failures;
  console.log('(a deliberate mismatch follows)');
  same('deliberate', c.choices[0].text, want + 'x');
  if (failures === before + 1)
    failures = before;
  else
    check(false, 'a wrong oracle text was not reported');

  console.log('completion: ' + JSON.stringify(c.choices[0].text) + '; chat: ' +
    JSON.stringify(ch.choices[0].message.content));
}

main().then(() => {
  if (failures) {
    console.log(failures + ' failure(s)');
    process.exit(1);
  }
  console.log('openai_sdk: all checks passed');
}, (e) => {
  console.log('FAIL: the SDK threw: ' + (e && e.stack ? e.stack : e));
  process.exit(1);
});
