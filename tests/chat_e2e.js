// SPDX-License-Identifier: MIT
// tests/chat_e2e.js - the OpenAI SDK (npm `openai`) against a running `dpshard serve`, for
// tests/chat_e2e.sh. Checks chat.completions.create without and with streaming, and
// completions.create on the same prompt's ids, against Hugging Face's tokenizer (npm
// `tokenizers`) and the prompt Jinja2 rendered (a file written by the shell script):
//   - POST /tokenize of the messages gives exactly the ids the tokenizers library gives for
//     the Jinja2-rendered prompt (and usage.prompt_tokens counts them);
//   - the chat reply (sampled, seeded) is the library's decode of the completion of those ids,
//     skipping special tokens; the streamed deltas (role first) concatenate to it;
//   - a wrong expectation is reported (the check can fail).
//   node chat_e2e.js NPM_DIR PORT TOKENIZER_JSON RENDERED_PROMPT_FILE MESSAGES_JSON
'use strict';
const fs = require('fs');
const path = require('path');
const http = require('http');

const [npmDir, port, tokenizerJson, renderedFile, messagesFile] = process.argv.slice(2);
const mod = require(path.join(npmDir, 'node_modules', 'openai'));
const OpenAI = mod.OpenAI || mod.default || mod;
const { Tokenizer } = require(path.join(npmDir, 'node_modules', 'tokenizers'));

let failures = 0;
function check(cond, msg) {
  if (!cond) {
    console.log('FAIL: ' + msg);
    failures++;
  }
  return cond;
}

function post(p, body) {
  return new Promise((resolve, reject) => {
    const data = JSON.stringify(body);
    const req = http.request({ host: '127.0.0.1', port, path: p, method: 'POST',
      headers: { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(data) } },
    (res) => {
      let b = '';
      res.on('data', (c) => { b += c; });
      res.on('end', () => resolve([res.statusCode, b]));
    });
    req.on('error', reject);
    req.end(data);
  });
}

const same = (a, b) => JSON.stringify(a) === JSON.stringify(b);

async function main() {
  const tok = Tokenizer.fromFile(tokenizerJson);
  const rendered = fs.readFileSync(renderedFile, 'utf8');
  const messages = JSON.parse(fs.readFileSync(messagesFile, 'utf8'));
  const want = (await tok.encode(rendered, null, { addSpecialTokens: false })).getIds();
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'none' });
  const model = (await client.models.list()).data[0].id;

  const [st, body] = await post('/tokenize', { model, messages, add_generation_prompt: true });
  const got = st === 200 ? JSON.parse(body).tokens : null;
  check(st === 200 && same(got, want), `/tokenize of the messages: ${st} ${JSON.stringify(got)
    .slice(0, 300)} want ${JSON.stringify(want).slice(0, 300)}`);
  check(!same(want, want.slice(1)), 'self-check: a shortened expectation is not different');

  const args = { model, messages, max_tokens: 12, temperature: 1, seed: 7 };
  const chat = await client.chat.completions.create(args);
  const choice = chat.choices[0];
  check(chat.object === 'chat.completion' && choice.message.role === 'assistant' &&
    typeof choice.message.content === 'string', `chat.completion: ${JSON.stringify(chat)}`);
  check(chat.usage.prompt_tokens === want.length, `usage.prompt_tokens ${chat.usage.prompt_tokens}, want ${want.length}`);

  // The same ids through /v1/completions: the reply is their completion's decode.
  const cmpl = await client.completions.create({ model, prompt: want, max_tokens: 12,
    temperature: 1, seed: 7 });
  const ids = cmpl.choices[0].token_ids;
  const text = await tok.decode(ids, true);
  check(choice.message.content === text, `chat reply ${JSON.stringify(choice.message.content)}, ` +
    `the library's decode of the completion ${JSON.stringify(text)}`);
  check(choice.message.content.length > 0, 'the reply has no text');
  check(text !== text + 'x', 'self-check');

  const stream = await client.chat.completions.create({ ...args, stream: true,
    stream_options: { include_usage: true } });
  let first = null;
  let streamed = '';
  let finish = null;
  let usage = null;
  for await (const chunk of stream) {
    check(chunk.object === 'chat.completion.chunk', `chunk object ${chunk.object}`);
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (first === null) first = c.delta;
      if (c.delta && typeof c.delta.content === 'string') streamed += c.delta.content;
      if (c.finish_reason) finish = c.finish_reason;
    }
  }
  check(first && first.role === 'assistant', `the first delta ${JSON.stringify(first)} has no role`);
  check(streamed === choice.message.content, `streamed ${JSON.stringify(streamed)} != ${JSON.stringify(choice.message.content)}`);
  check(finish === choice.finish_reason, `stream finish ${finish} != ${choice.finish_reason}`);
  check(usage && usage.completion_tokens === chat.usage.completion_tokens, `stream usage ${JSON.stringify(usage)}`);

  // Errors the SDK surfaces: a bad request is a 400 with a message.
  try {
    await client.chat.completions.create({ model, messages: [], max_tokens: 2 });
    check(false, 'empty messages were accepted');
  } catch (e) {
    check(e.status === 400, `empty messages: status ${e.status}`);
  }
  console.log(`${failures ? 'FAILED' : 'ok'}: ${model}: prompt ${want.length} tokens, reply ` +
    `${JSON.stringify(choice.message.content)}`);
  process.exit(failures ? 1 : 0);
}

main().catch((e) => {
  console.log('FAIL: ' + (e && e.stack ? e.stack : e));
  process.exit(1);
});
