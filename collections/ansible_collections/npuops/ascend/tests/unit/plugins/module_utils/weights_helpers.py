# -*- coding: utf-8 -*-
"""Synthetic model directories for the weight tests: safetensors files with valid headers."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os
import struct


def safetensors(path, payload_bytes, seed=0):
    """A structurally valid .safetensors file with `payload_bytes` of pseudo-random tensor data."""
    header = json.dumps({"__metadata__": {"format": "pt"},
                         "w": {"dtype": "I8", "shape": [payload_bytes], "data_offsets": [0, payload_bytes]}})
    header = header.encode() + b" " * (-len(header) % 8)
    block = os.urandom(1 << 16) if seed is None else bytes((i * 131 + seed) % 251 for i in range(1 << 16))
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)))
        f.write(header)
        left = payload_bytes
        while left:
            n = min(left, len(block))
            f.write(block[:n])
            left -= n


def model_dir(root, sizes=(3 << 20, 5 << 20, 1 << 20)):
    os.makedirs(root)
    for i, size in enumerate(sizes):
        safetensors(os.path.join(root, "model-%05d-of-%05d.safetensors" % (i + 1, len(sizes))), size, seed=i)
    with open(os.path.join(root, "config.json"), "w") as f:
        json.dump({"architectures": ["KimiK3ForCausalLM"], "num_hidden_layers": 61}, f)
    os.makedirs(os.path.join(root, "tokenizer"))
    with open(os.path.join(root, "tokenizer", "tokenizer.model"), "wb") as f:
        f.write(b"tok" * 1000)
    return root
