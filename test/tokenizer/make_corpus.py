#!/usr/bin/env python3
"""make_corpus.py — a small corpus for test_prepare.sh, and what prepare must make of it.

Usage: make_corpus.py OUT_DIR

Writes OUT_DIR/corpus/ (text files, a nested directory, a hidden file, an empty file, a
JSONL file with escapes, NUL, surrogate pairs, CRLF, blank lines and an empty text) and
OUT_DIR/separated.txt (100 documents separated by "\\n\\n=====\\n\\n"). Manifests list the
documents prepare must produce, in its reading order (paths sorted, hidden files skipped,
empty documents dropped), one lowercase hex line each:
  manifest_corpus.txt      the corpus directory with the default options
  manifest_jsonl.txt       corpus/docs.jsonl alone
  manifest_separated.txt   separated.txt with --separator
"""
import json
import os
import random
import sys

out = sys.argv[1]
corpus = os.path.join(out, "corpus")
os.makedirs(os.path.join(corpus, "sub"), exist_ok=True)
rng = random.Random(20261122)

words = ("the quick brown fox jumps over a lazy dog while Elinor and Marianne talk of "
         "sense sensibility 1811 pride prejudice 42 naïve café Straße Москва 東京 😀 👍🏽").split()


def prose(n_words):
    line = []
    for i in range(n_words):
        line.append(rng.choice(words))
        if rng.random() < 0.1:
            line.append(rng.choice([",", ".", "!", "?", ";", "'s", "'LL"]))
        if rng.random() < 0.05:
            line.append(rng.choice(["\n", "\n\n", "\t", "   "]))
    return " ".join(line)


files = {}  # relative path -> bytes
files["a.txt"] = (prose(3000) + "\n").encode()
files["b.txt"] = "Ünïcödé — 中文字 — 한국어 — العربية — emoji 👩‍💻🇫🇷\n".encode() * 40
files["c.txt"] = b"invalid \xff\xfe bytes \xc3 and a spelled <|endoftext|> and <|begin_of_text|>\r\n" * 30
files["empty.txt"] = b""
files["sub/d.txt"] = (prose(800)).encode()
files[".hidden.txt"] = b"must be skipped\n"

json_docs = []  # (line, expected text bytes or None for lines that make no document)
for i in range(60):
    text = prose(rng.randint(1, 200))
    json_docs.append((json.dumps({"id": i, "text": text, "meta": {"text": "not this", "n": [1, 2.5e3, None, True]}}),
                      text.encode()))
json_docs.append(('{"text": "nul\\u0000inside and \\ud83d\\ude00 pair and \\"quotes\\" \\\\ \\/"}',
                  'nul\0inside and 😀 pair and "quotes" \\ /'.encode()))
json_docs.append(('{"text": "lone \\ud800 surrogate"}', "lone \ufffd surrogate".encode()))
json_docs.append(('   ', None))                      # blank line: skipped
json_docs.append(('{"text": ""}', None))              # empty text: no document
json_docs.append(('{"other": 1, "text": "crlf line"}\r', b"crlf line"))
json_docs.append(('{"text": "last line without a newline"}', b"last line without a newline"))
files["docs.jsonl"] = "\n".join(line for line, _ in json_docs).encode()

for rel, data in files.items():
    with open(os.path.join(corpus, rel), "wb") as f:
        f.write(data)


def walk(directory):
    """prepare's order: names sorted bytewise, directories recursed, hidden entries skipped."""
    for name in sorted(os.listdir(directory), key=lambda s: s.encode()):
        if name.startswith("."):
            continue
        path = os.path.join(directory, name)
        if os.path.isdir(path):
            yield from walk(path)
        else:
            yield path


def documents_of(path):
    with open(path, "rb") as f:
        data = f.read()
    if path.endswith(".jsonl"):
        return [text for _, text in json_docs if text]
    return [data] if data else []


def write_manifest(name, docs):
    with open(os.path.join(out, name), "w") as f:
        for d in docs:
            f.write(d.hex() + "\n")


write_manifest("manifest_corpus.txt", [d for p in walk(corpus) for d in documents_of(p)])
write_manifest("manifest_jsonl.txt", [text for _, text in json_docs if text])

separated = []
for i in range(100):
    separated.append((f"Document {i}. " + prose(rng.randint(0, 60))).encode())
separated.insert(50, b"")  # an empty piece between two separators: no document
with open(os.path.join(out, "separated.txt"), "wb") as f:
    f.write(b"\n\n=====\n\n".join(separated))
write_manifest("manifest_separated.txt", [d for d in separated if d])
print(f"corpus in {corpus}")
