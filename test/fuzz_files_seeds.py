"""Writes the seed corpus of test/fuzz_files.c into DIR: valid inputs of each of its readers,
each prefixed by the byte that picks the reader (0 JSON, 1 safetensors, 2 tokenizer.json).
Standard library only. Usage: python3 test/fuzz_files_seeds.py DIR"""
import json
import os
import struct
import sys


def json_seeds():
    return [
        b'{"text":"hello"}',
        b'{"id": 7, "text": "caf\\u00e9 \\ud83d\\ude00\\n\\t\\"q\\"", "meta": {"url": "x", "n": [1, 2.5e3, -0, true, null]}}',
        b'  {"meta":{"text":1},"text":"nested text is not the member"}  ',
        b'{"text":"a","text":"b"}',
        b'{"text":3}',
        b'[{"text":"in an array"}]',
        b'{"a":[[[[[[[[{"b":{}}]]]]]]]],"text":""}',
        b'{"text":"\\/\\\\\\b\\f\\r","x":"\\uD800\\u0041"}',
        b'{"n":123456789012345678901234567890,"m":1E+400,"text":"big numbers"}',
        b'{"text":"raw bytes \xc3\xa9 \xff"}',
    ]


def raw_safetensors(header, data):
    header += b" " * (-(8 + len(header)) % 8)
    return struct.pack("<Q", len(header)) + header + data


def safetensors_bytes(tensors, metadata):
    header = {"__metadata__": metadata} if metadata is not None else {}
    data = b""
    for name, shape, values in tensors:
        begin = len(data)
        data += struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [begin, len(data)]}
    return raw_safetensors(json.dumps(header, separators=(",", ":")).encode(), data)


MODEL_CONFIG = {
    "vocab_size": 64, "n_layer": 2, "d_model": 16, "n_head": 2, "n_kv_head": 1, "head_dim": 8, "d_ff": 32,
    "seq_len": 32, "rope_theta": 10000.0, "nope_every": 4, "qk_norm": True, "tie_embeddings": True,
    "norm_eps": 1e-6, "init_std": 0.02, "doc_masking": True, "doc_token": 0,
}


def safetensors_seeds():
    config = json.dumps(MODEL_CONFIG, separators=(",", ":"))
    return [
        safetensors_bytes([("model.embed_tokens.weight", [4, 2], [0.5 * i for i in range(8)]),
                           ("model.norm.weight", [2], [1.0, 1.0])], {"model_config": config}),
        safetensors_bytes([("a", [], [3.0]), ("b", [0, 5], []), ("c", [3], [1.0, 2.0, 3.0])], None),
        safetensors_bytes([("w", [2, 2], [1.0, 2.0, 3.0, 4.0])], {"format": "pt"}),
        # Two __metadata__ objects (JSON allows a key twice): the second once wrote past the
        # first's arrays.
        raw_safetensors(b'{"__metadata__":{"a":"1","b":"2","c":"3"},"__metadata__":{"d":"4"},'
                        b'"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', struct.pack("<f", 1.0)),
        # Values no config could give: once read in as inf, written back as null.
        safetensors_bytes([("a", [1], [1.0])], {"model_config": config.replace('"rope_theta":10000.0', '"rope_theta":1e999')}),
    ]


def byte_alphabet():
    """GPT-2's map from bytes to the printable characters that spell them in tokenizer.json."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def tokenizer_seed(pre_tokenizer, merges_as_lists):
    chars = byte_alphabet()
    spell = lambda bs: "".join(chars[b] for b in bs)
    vocab = {spell([b]): b for b in range(256)}
    merges = []
    for a, b in [(b" ", b"t"), (b"h", b"e"), (b" t", b"he"), (b"i", b"n"), (b"e", b"r"), (b"\xc3", b"\xa9"),
                 (b"\n", b"\n"), (b" ", b"a")]:
        merged = a + b
        if spell(merged) not in vocab:
            vocab[spell(merged)] = len(vocab)
        merges.append([spell(a), spell(b)] if merges_as_lists else spell(a) + " " + spell(b))
    added = [{"id": len(vocab), "content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True}]
    doc = {"version": "1.0", "normalizer": None, "added_tokens": added, "pre_tokenizer": pre_tokenizer,
           "model": {"type": "BPE", "dropout": None, "ignore_merges": False, "vocab": vocab, "merges": merges}}
    return json.dumps(doc, ensure_ascii=False).encode()


def tokenizer_seeds():
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    split = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": "\\s+|\\p{L}+|\\p{N}{1,3}|[^\\s\\p{L}\\p{N}]+"}, "behavior": "Isolated",
         "invert": False},
        dict(byte_level, use_regex=False)]}
    return [tokenizer_seed(byte_level, False), tokenizer_seed(split, True)]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    groups = [(0, json_seeds()), (1, safetensors_seeds()), (2, tokenizer_seeds())]
    for reader, seeds in groups:
        for i, seed in enumerate(seeds):
            with open(os.path.join(out, "seed-%d-%02d" % (reader, i)), "wb") as f:
                f.write(bytes([reader]) + seed)


if __name__ == "__main__":
    main()
