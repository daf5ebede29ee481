"""The vLLM / vllm-ascend version this stand-in emulates, and what that version has.

The image carries the collection's version table as versions.json and, in its environment, the versions its tag
claims (NPUOPS_SIM_VLLM_VERSION, NPUOPS_SIM_PROXY: npuops_sim/image.py), so a `main-a3` container answers like
vLLM 0.27.1 and a `v0.23.0-a3` one like vLLM 0.23.0: parser names, tokenizer modes, KV-cache dtypes and bench
result fields are those of that version (data/images.yml says where each was read)."""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def table():
    with open(os.path.join(HERE, "versions.json")) as f:
        return json.load(f)


def vllm_version():
    return os.environ.get("NPUOPS_SIM_VLLM_VERSION") or str(table()["images"][0]["vllm"])


def vllm():
    """The emulated vLLM's capabilities: reasoning_parsers, tool_call_parsers, tokenizer_modes, kv_cache_dtypes,
    reasoning_field, bench_latencies; plus what the image's vllm-ascend registers (NPUOPS_SIM_VLLM_ASCEND_REGISTERS,
    field:name,name;...: the kimi_k3 parsers of the Kimi-K3 images, as vllm_ascend/patch/platform registers them)."""
    out = dict(table()["vllm"][vllm_version()], version=vllm_version())
    for part in filter(None, os.environ.get("NPUOPS_SIM_VLLM_ASCEND_REGISTERS", "").split(";")):
        field, _, names = part.partition(":")
        out[field] = list(out.get(field) or []) + [n for n in names.split(",") if n not in (out.get(field) or [])]
    return out


def proxy():
    """The emulated vllm-ascend PD proxy: routes, prefill_error, decode_error, line."""
    line = os.environ.get("NPUOPS_SIM_PROXY") or str(table()["images"][0]["proxy"])
    return dict(table()["proxy"][line], line=line)


def line():
    """The emulated vLLM-Ascend release line (NPUOPS_SIM_LINE) and what the table says of it: {name, cann, mooncake,
    refuses_jemalloc}."""
    name = os.environ.get("NPUOPS_SIM_LINE") or ""
    return dict((table().get("line_facts") or {}).get(name) or {}, name=name)
