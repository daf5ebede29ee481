"""Synthetic model weights for the simulated nodes (test infrastructure): valid safetensors files of
pseudo-random bytes, plus a config.json, written into a node's model directory."""
import json
import os
import struct

BLOCK = 16 * 1024 * 1024


def parse_size(text):
    text = str(text).strip().upper()
    for suffix, mult in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if text.endswith(suffix):
            return int(float(text[:-1]) * mult)
    return int(text)


def write_model(root, total_bytes, files=8, seed=0):
    """`files` safetensors shards of about total/files bytes each; -> list of paths written."""
    os.makedirs(root, exist_ok=True)
    rnd = bytearray(os.urandom(BLOCK))
    out = []
    per = max(1, total_bytes // files)
    for i in range(files):
        payload = per - 256
        header = json.dumps({"__metadata__": {"format": "pt", "npuops_sim": "synthetic"},
                             "layers.%d.w" % i: {"dtype": "I8", "shape": [payload], "data_offsets": [0, payload]}})
        header = header.encode() + b" " * (-len(header) % 8)
        path = os.path.join(root, "model-%05d-of-%05d.safetensors" % (i + 1, files))
        with open(path, "wb") as f:
            f.write(struct.pack("<Q", len(header)) + header)
            left, k = payload, 0
            view = memoryview(rnd)
            while left:
                # rotate the random block per chunk so no two chunks (or files) are alike
                shift = (k * 7919 + i * 104729 + seed) % BLOCK
                chunk = bytes(view[shift:]) + bytes(view[:shift])
                n = min(left, BLOCK)
                f.write(chunk[:n])
                left -= n
                k += 1
        out.append(path)
    with open(os.path.join(root, "config.json"), "w") as f:
        # Kimi's tokenizer is custom code (auto_map), so loading it needs trust_remote_code, as the real one does
        json.dump({"architectures": ["KimiK3ForCausalLM"], "model_type": "kimi_k3", "num_hidden_layers": 61,
                   "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
                   "npuops_sim": "synthetic weights"}, f)
    out.append(os.path.join(root, "config.json"))
    return out
