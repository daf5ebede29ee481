# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json

import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import vllm_cli

BASE = {"model": "/data/m", "tensor_parallel_size": 16, "served_model_name": "kimi-k3"}


def test_render_is_ordered_and_typed():
    argv = vllm_cli.render(dict(BASE, enable_prefix_caching=False, enable_expert_parallel=True, headless=False,
                                compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY"}, gpu_memory_utilization=0.9))
    assert argv[:3] == ["vllm", "serve", "/data/m"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "16"
    assert "--no-enable-prefix-caching" in argv and "--enable-expert-parallel" in argv and "--headless" not in argv
    assert json.loads(argv[argv.index("--compilation-config") + 1]) == {"cudagraph_mode": "FULL_DECODE_ONLY"}
    assert argv.index("--served-model-name") < argv.index("--tensor-parallel-size")  # FLAGS order, stable
    assert vllm_cli.render(dict(BASE, gpu_memory_utilization=0.9)) == vllm_cli.render(
        dict(reversed(list(dict(BASE, gpu_memory_utilization=0.9).items()))))


@pytest.mark.parametrize("spec,message", [
    (dict(BASE, tensor_paralel_size=8),
     r"unknown vllm serve option 'tensor_paralel_size' \(did you mean tensor_parallel_size"),
    (dict(BASE, max_model_len="131072"), r"max_model_len = '131072': expected int"),
    (dict(BASE, enable_prefix_caching="yes"), r"expected true/false"),
    (dict(BASE, mm_encoder_tp_mode="tensor"), r"mm_encoder_tp_mode = 'tensor': must be one of weights, data"),
    (dict(BASE, gpu_memory_utilization=1.5), r"must be in \(0, 1\]"),
    (dict(BASE, headless=True, api_server_count=2), r"api_server_count can't be set in headless mode"),
    (dict(BASE, data_parallel_size=4, data_parallel_rank=1, data_parallel_start_rank=1), r"exclude each other"),
    (dict(BASE, nnodes=2, node_rank=1), r"nnodes = 2 needs master_addr"),
    (dict(BASE, nnodes=2, node_rank=2, master_addr="a", master_port=1), r"node_rank 2 is outside"),
    (dict(BASE, data_parallel_size=4, data_parallel_start_rank=4), r"outside \[0, data_parallel_size=4\)"),
    (dict(BASE, enable_auto_tool_choice=True), r"needs tool_call_parser"),
    ({"tensor_parallel_size": 16}, r"no model"),
])
def test_what_vllm_refuses_is_refused_here(spec, message):
    with pytest.raises(vllm_cli.VllmCliError, match=message):
        vllm_cli.render(spec)


def test_the_kv_cache_dtype_is_the_images_to_decide():
    """Which KV-cache dtypes exist depends on the image (vLLM's CacheDType plus what vllm-ascend registers: the
    field report's image ran --kv-cache-dtype int8): the planner checks it against the image's line
    (plugin_utils/versions.py), the renderer passes it through."""
    argv = vllm_cli.render(dict(BASE, kv_cache_dtype="int8", block_size=768))
    assert argv[argv.index("--kv-cache-dtype") + 1] == "int8" and argv[argv.index("--block-size") + 1] == "768"


def test_every_flag_is_a_vllm_style_flag():
    for key, (flag, kind) in vllm_cli.FLAGS.items():
        assert flag == "--" + key.replace("_", "-") and kind in ("int", "float", "str", "names", "json", "flag", "toggle")


def test_served_model_name_takes_several_names_as_vllm_does():
    # vLLM's --served-model-name is nargs="+": the first name answers, every one is accepted
    spec = {"model": "/m", "served_model_name": ["k3-v2", "kimi-k3"], "port": 8000}
    assert vllm_cli.render(spec)[3:7] == ["--served-model-name", "k3-v2", "kimi-k3", "--port"]
    assert vllm_cli.render({"model": "/m", "served_model_name": "kimi-k3"})[3:] == ["--served-model-name", "kimi-k3"]
    for bad in ([], [""], ["--port"], 3):
        with pytest.raises(vllm_cli.VllmCliError, match="expected a name or a list of names"):
            vllm_cli.render({"model": "/m", "served_model_name": bad})
    from ansible_collections.npuops.ascend.plugins.plugin_utils import recipes
    assert recipes.command_spec("vllm serve /m --served-model-name a b --port 1", "t") == {
        "model": "/m", "served_model_name": ["a", "b"], "port": 1}
    assert recipes.command_spec("vllm serve /m --served-model-name a --port 1", "t")["served_model_name"] == "a"
