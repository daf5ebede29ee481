# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Render the ``vllm serve`` command line from a typed spec, and refuse what vLLM would refuse.

FLAGS is the one table of every flag npuops emits, each checked against vLLM's own ``vllm serve`` parser
(CHECKED_AGAINST; tools/vllm_argcheck.py re-checks the example inventories' plans in CI with the parser of the
vLLM version their image carries, data/images.yml). What one vLLM version has and another lacks (parser names,
tokenizer modes, KV-cache dtypes) is checked per image by the planner (plugin_utils/versions.py). A spec key that
is not in the table is refused with the closest known keys, so a typo never reaches a 40-minute weight load.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import difflib
import json

CHECKED_AGAINST = "vLLM 0.23.0, 0.27.1, 0.32.0 (vllm serve parser, built with VLLM_TARGET_DEVICE=cpu)"

# spec key: (flag, kind). Kinds: int, float, str, names (nargs="+": one name or a list of them), json (a dict passed
# as JSON), flag (store_true: present when true), toggle (BooleanOptionalAction: --x when true, --no-x when false).
FLAGS = {
    "served_model_name": ("--served-model-name", "names"),
    "host": ("--host", "str"),
    "port": ("--port", "int"),
    "trust_remote_code": ("--trust-remote-code", "flag"),
    "tensor_parallel_size": ("--tensor-parallel-size", "int"),
    "pipeline_parallel_size": ("--pipeline-parallel-size", "int"),
    "distributed_executor_backend": ("--distributed-executor-backend", "str"),
    "nnodes": ("--nnodes", "int"),
    "node_rank": ("--node-rank", "int"),
    "master_addr": ("--master-addr", "str"),
    "master_port": ("--master-port", "int"),
    "data_parallel_size": ("--data-parallel-size", "int"),
    "data_parallel_size_local": ("--data-parallel-size-local", "int"),
    "data_parallel_start_rank": ("--data-parallel-start-rank", "int"),
    "data_parallel_rank": ("--data-parallel-rank", "int"),
    "data_parallel_address": ("--data-parallel-address", "str"),
    "data_parallel_rpc_port": ("--data-parallel-rpc-port", "int"),
    "enable_expert_parallel": ("--enable-expert-parallel", "flag"),
    "headless": ("--headless", "flag"),
    "api_server_count": ("--api-server-count", "int"),
    "quantization": ("--quantization", "str"),
    "tokenizer_mode": ("--tokenizer-mode", "str"),
    "reasoning_parser": ("--reasoning-parser", "str"),
    "tool_call_parser": ("--tool-call-parser", "str"),
    "enable_auto_tool_choice": ("--enable-auto-tool-choice", "flag"),
    "enable_prefix_caching": ("--enable-prefix-caching", "toggle"),
    "max_model_len": ("--max-model-len", "int"),
    "max_num_seqs": ("--max-num-seqs", "int"),
    "max_num_batched_tokens": ("--max-num-batched-tokens", "int"),
    "gpu_memory_utilization": ("--gpu-memory-utilization", "float"),
    "kv_cache_dtype": ("--kv-cache-dtype", "str"),
    "block_size": ("--block-size", "int"),
    "compilation_config": ("--compilation-config", "json"),
    "safetensors_load_strategy": ("--safetensors-load-strategy", "str"),
    "load_format": ("--load-format", "str"),
    "enforce_eager": ("--enforce-eager", "flag"),
    "seed": ("--seed", "int"),
    "kv_transfer_config": ("--kv-transfer-config", "json"),
    "speculative_config": ("--speculative-config", "json"),
    "additional_config": ("--additional-config", "json"),
    # what the Kimi-K3 recipes add (data/recipes): a tokenizer directory, dtype, multimodal and hybrid-cache options
    "tokenizer": ("--tokenizer", "str"),
    "dtype": ("--dtype", "str"),
    "allowed_local_media_path": ("--allowed-local-media-path", "str"),
    "mm_processor_cache_gb": ("--mm-processor-cache-gb", "float"),
    "mm_encoder_tp_mode": ("--mm-encoder-tp-mode", "str"),
    "limit_mm_per_prompt": ("--limit-mm-per-prompt", "json"),
    "skip_mm_profiling": ("--skip-mm-profiling", "flag"),
    "mamba_cache_mode": ("--mamba-cache-mode", "str"),
    "language_model_only": ("--language-model-only", "flag"),
}

CHOICES = {
    "distributed_executor_backend": ("mp", "ray", "uni", "external_launcher"),
    "safetensors_load_strategy": ("eager", "lazy", "prefetch", "torchao"),
    "mm_encoder_tp_mode": ("weights", "data"),
}


class VllmCliError(ValueError):
    pass


def closest(key):
    near = difflib.get_close_matches(key, list(FLAGS), n=3, cutoff=0.6)
    return (" (did you mean %s?)" % ", ".join(near)) if near else ""


def validate(spec):
    """Refuse unknown keys (naming the closest known), wrong types, and combinations vLLM refuses."""
    if not spec.get("model"):
        raise VllmCliError("the spec has no model (the weights directory in the container)")
    for key, value in spec.items():
        if key == "model" or value is None:
            continue
        if key not in FLAGS:
            raise VllmCliError("unknown vllm serve option %r%s" % (key, closest(key)))
        _flag, kind = FLAGS[key]
        ok = {"int": lambda v: isinstance(v, int) and not isinstance(v, bool),
              "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
              "str": lambda v: isinstance(v, str) and v != "",
              "names": lambda v: (isinstance(v, str) and v != "") or (
                  isinstance(v, list) and bool(v) and all(isinstance(n, str) and n and not n.startswith("-")
                                                          for n in v)),
              "json": lambda v: isinstance(v, dict),
              "flag": lambda v: isinstance(v, bool),
              "toggle": lambda v: isinstance(v, bool)}[kind](value)
        if not ok:
            raise VllmCliError("%s = %r: expected %s" % (key, value, {
                "json": "a dict", "flag": "true/false", "toggle": "true/false",
                "names": "a name or a list of names"}.get(kind, kind)))
        if key in CHOICES and value not in CHOICES[key]:
            raise VllmCliError("%s = %r: must be one of %s" % (key, value, ", ".join(CHOICES[key])))
    util = spec.get("gpu_memory_utilization")
    if util is not None and not 0 < util <= 1:
        raise VllmCliError("gpu_memory_utilization = %r: must be in (0, 1]" % util)
    if spec.get("headless") and (spec.get("api_server_count") or 1) > 1:
        raise VllmCliError("api_server_count can't be set in headless mode")
    if spec.get("data_parallel_rank") is not None and spec.get("data_parallel_start_rank") is not None:
        raise VllmCliError("data_parallel_rank (external load balancing) and data_parallel_start_rank (headless "
                           "workers) exclude each other")
    if (spec.get("nnodes") or 1) > 1:
        for key in ("node_rank", "master_addr", "master_port"):
            if spec.get(key) is None:
                raise VllmCliError("nnodes = %s needs %s" % (spec["nnodes"], key))
        if not 0 <= spec["node_rank"] < spec["nnodes"]:
            raise VllmCliError("node_rank %s is outside [0, nnodes=%s)" % (spec["node_rank"], spec["nnodes"]))
    dp = spec.get("data_parallel_size") or 1
    for key in ("data_parallel_rank", "data_parallel_start_rank"):
        rank = spec.get(key)
        if rank is not None and not 0 <= rank < dp:
            raise VllmCliError("%s %s is outside [0, data_parallel_size=%s)" % (key, rank, dp))
    if spec.get("enable_auto_tool_choice") and not spec.get("tool_call_parser"):
        raise VllmCliError("enable_auto_tool_choice needs tool_call_parser")
    return spec


def render(spec):
    """-> argv ["vllm", "serve", <model>, --flag value, ...] in FLAGS order (stable, so it hashes stably)."""
    validate(spec)
    argv = ["vllm", "serve", spec["model"]]
    for key, (flag, kind) in FLAGS.items():
        value = spec.get(key)
        if value is None:
            continue
        if kind == "flag":
            if value:
                argv.append(flag)
        elif kind == "toggle":
            argv.append(flag if value else "--no-" + flag[2:])
        elif kind == "json":
            argv += [flag, json.dumps(value, sort_keys=True, separators=(",", ":"))]
        elif kind == "names" and isinstance(value, list):
            argv += [flag] + [str(v) for v in value]
        else:
            argv += [flag, str(value)]
    return argv
