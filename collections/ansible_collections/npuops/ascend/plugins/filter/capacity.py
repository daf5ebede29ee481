# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""capacity_plan: will the model fit, and how much KV cache (how many sequences) is left.

The estimate, per die (one logical NPU), for one engine instance of TP x PP x DP dies:

  weights/die   = W * ((1 - e) / (TP*PP) + e / (TP*PP*EPDIV))       e = expert share of the weights,
                                                                    EPDIV = DP with expert parallelism, else 1
  usable/die    = HBM_total * gpu_memory_utilization                 (vLLM budgets against total HBM)
  KV budget/die = usable - weights - runtime overhead                (activations, HCCL buffers, graphs)
  KV bytes/token/die = ceil(kv_cache_layers / PP) * kv_elements * dtype_bytes (MLA: one latent of kv_lora_rank +
                                                                    rope dims per layer, replicated over TP)
  KV tokens     = KV budget / KV bytes per token (per DP replica; vLLM reports it per DP group)
  sequences at context L = floor(KV tokens / L) per replica, x DP for the instance

A draft for speculative decoding (npuops_draft) adds its weights (divided by its TP) to every die and its layers'
KV elements to every token (plugins/plugin_utils/speculative.py sizing; its size is an assumption of its preset).

Assumptions, stated so they can be checked: of Kimi-K3's 93 layers, 61 keep a per-token MLA cache (kv_lora_rank
512 + rope 64 = 576 KV elements per layer per token; its Kimi Delta Attention layers keep a fixed-size state); the runtime overhead does not depend
on gpu_memory_utilization. The overhead is calibrated on the one published data point: Kimi-K3.1-Pro
W4A8 (1.47 TB) on 2 x A3 (32 dies, TP16 x PP2) = 42.8 GiB of weights per die and, at 0.90 utilization
with an int8 KV cache (block size 768), 468,750 KV tokens — at most 2 concurrent 200K sessions.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError
from ansible_collections.npuops.ascend.plugins.plugin_utils import speculative

GIB = 1024.0 ** 3
MIB = 1024 * 1024
# calibrated on the published data point (see the module docstring); overridable per preset
RUNTIME_OVERHEAD_GIB = 7.022
DTYPE_BYTES = {"int8": 1, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "auto": 2, "bfloat16": 2, "bf16": 2,
               "float16": 2, "fp16": 2}


def plan(preset, tp, pp=1, dp=1, expert_parallel=False, hbm_total_mb=65536, overrides=None, contexts=None):
    """-> dict of the estimate plus `errors` (does not fit) and `warnings` (fits, with limits)."""
    p = dict(preset)
    p.update(overrides or {})
    tp, pp, dp = int(tp), int(pp), int(dp)
    weights = float(p["weights_bytes"])
    e = float(p.get("expert_fraction", 0.0))
    ep_div = dp if expert_parallel else 1
    per_die = weights * ((1.0 - e) / (tp * pp) + e / (tp * pp * ep_div))
    util = float(p.get("gpu_memory_utilization", 0.9))
    usable = float(hbm_total_mb) * MIB * util
    overhead = float(p.get("runtime_overhead_gib", RUNTIME_OVERHEAD_GIB)) * GIB
    # a C8 checkpoint (quant description kv_cache_type: C8) stores the KV cache in int8 whatever --kv-cache-dtype says
    dtype = "int8" if str(p.get("kv_cache_quant") or "").upper() == "C8" else str(p.get("kv_cache_dtype", "auto"))
    if dtype not in DTYPE_BYTES:
        raise AnsibleFilterError("capacity_plan: unknown kv_cache_dtype %r (known: %s)" % (dtype, sorted(DTYPE_BYTES)))
    layers_per_die = -(-int(p.get("kv_cache_layers") or p["layers"]) // pp)
    kv_per_token = layers_per_die * int(p["kv_elements_per_token_per_layer"]) * DTYPE_BYTES[dtype]
    # a draft (npuops_draft) holds its weights on every die of its TP and its layers' KV in the same block pool
    draft = speculative.sizing(p["draft"], tp) if p.get("draft") else {"weights_bytes": 0.0, "kv_elements_per_token": 0,
                                                                       "kv_cache_dtype": "auto"}
    if draft["kv_cache_dtype"] not in DTYPE_BYTES:
        raise AnsibleFilterError("capacity_plan: unknown kv_cache_dtype %r of the draft (known: %s)"
                                 % (draft["kv_cache_dtype"], sorted(DTYPE_BYTES)))
    per_die += draft["weights_bytes"]
    kv_per_token += draft["kv_elements_per_token"] * DTYPE_BYTES[draft["kv_cache_dtype"]]
    budget = usable - per_die - overhead
    kv_tokens = int(budget // kv_per_token) if budget > 0 else 0
    block = int(p.get("block_size", 128))
    max_len = int(p.get("max_model_len", 0))
    max_seqs = int(p.get("max_num_seqs", 0))
    out = {
        "dies": tp * pp * dp,
        "weights_bytes_per_die": int(per_die),
        "weights_gib_per_die": round(per_die / GIB, 2),
        "draft_gib_per_die": round(draft["weights_bytes"] / GIB, 2),
        "usable_gib_per_die": round(usable / GIB, 2),
        "overhead_gib_per_die": round(overhead / GIB, 2),
        "kv_budget_gib_per_die": round(budget / GIB, 2),
        "kv_bytes_per_token_per_die": kv_per_token,
        "kv_tokens": kv_tokens,
        "kv_blocks": kv_tokens // block,
        "block_size": block,
        "max_model_len": max_len,
        "max_num_seqs": max_seqs,
        "sequences_at_max_model_len": (kv_tokens // max_len) * dp if max_len else None,
        "sequences_at": dict((int(c), (kv_tokens // int(c)) * dp) for c in (contexts or [])),
        "errors": [],
        "warnings": [],
    }
    if per_die > usable:
        values = (per_die / GIB, usable / GIB, hbm_total_mb, util, out["dies"])
        out["errors"].append(
            "weights need %.1f GiB per die but only %.1f GiB is usable (%d MB x %.2f): the model does not fit on "
            "%d dies; use more nodes or a smaller quantization" % values)
    elif kv_tokens == 0:
        out["errors"].append(
            "weights (%.1f GiB) and runtime overhead (%.1f GiB) leave no KV cache in %.1f GiB per die; raise "
            "gpu_memory_utilization or use more dies" % (per_die / GIB, overhead / GIB, usable / GIB))
    elif max_len and kv_tokens < max_len:
        rule = " (%s)" % p["context_rule"] if p.get("context_rule") else ""
        out["errors"].append("the KV cache holds %d tokens on %d dies, less than one sequence of max_model_len %d; "
                             "vLLM refuses to start: lower max_model_len or use more nodes%s"
                             % (kv_tokens, out["dies"], max_len, rule))
    elif max_len and max_seqs and max_len * max_seqs > kv_tokens:
        out["warnings"].append(
            "max_model_len %d x max_num_seqs %d = %d tokens exceeds the KV estimate of %d tokens per DP replica: "
            "at full length only %d sequences run at once (the rest wait)" % (
                max_len, max_seqs, max_len * max_seqs, kv_tokens, kv_tokens // max_len))
    return out


def capacity_plan(preset, group, hbm_total_mb=65536, overrides=None, contexts=None):
    try:
        return plan(preset, group.get("tp", 1), group.get("pp", 1), group.get("dp", 1),
                    bool(group.get("expert_parallel", False)), hbm_total_mb, overrides, contexts)
    except (KeyError, ValueError, TypeError) as e:
        raise AnsibleFilterError("capacity_plan: the model preset lacks or mistypes a field: %s" % e)


def capacity_by_group(groups, preset, hbm_total_mb=65536, contexts=None):
    """{group name: capacity_plan} for every engine group of a tier (the same in every instance)."""
    return dict((g["name"], capacity_plan(preset, g, hbm_total_mb, contexts=contexts)) for g in groups)


def capacity_problems(tier, preset, hbm_total_mb=65536):
    """The capacity errors of every engine group of a tier, each naming the tier and the group: what the plan refuses
    before any host is contacted (at the nominal HBM; preflight repeats the estimate with the HBM it reads)."""
    out = []
    for g in tier.get("groups") or []:
        for error in capacity_plan(preset, g, hbm_total_mb)["errors"]:
            out.append("tier %s, group %s (TP%s x PP%s x DP%s): %s" % (tier.get("name"), g["name"], g.get("tp", 1),
                                                                       g.get("pp", 1), g.get("dp", 1), error))
    return out


def instance_capacity_problems(specs, hbm_total_mb=65536):
    """capacity_problems of every instance (instance_specs: its tier document and model), each line naming
    the instance when there are several (replicas may serve different models)."""
    out = []
    for name, spec in (specs or {}).items():
        prefix = "instance %s: " % name if len(specs) > 1 else ""
        out.extend(prefix + p for p in capacity_problems(spec["tier"], spec["model_spec"], hbm_total_mb))
    return out


class FilterModule(object):
    def filters(self):
        return {"capacity_by_group": capacity_by_group, "instance_capacity_problems": instance_capacity_problems}
