# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Speculative decoding with a draft checkpoint (DSpark): the draft preset an inventory names, the rules a plan must
keep before any host is contacted, and the --speculative-config each engine runs.

The rules, each from where it is enforced:
- k = num_speculative_tokens > 0: vLLM's SpeculativeConfig refuses anything else ("Expected num_speculative_tokens
  to be greater than zero", vllm/config/speculative.py).
- 1 + k <= 16: vllm-ascend's attention metadata builders assert it (decode_threshold = 1 + k must stay within
  "npu_fused_infer_attention_score TND layout's limit of 16", vllm_ascend/attention/mla_v1.py, attention_v1.py).
- draft TP is 1 or the target's TP (vLLM SpeculativeConfig._verify_and_get_draft_tp); here it defaults to the
  target's, as the Kimi-K3 tutorial's section 5.2 sets it (draft_tensor_parallel_size 16 on TP16).
- the draft's max_model_len <= the target's (SpeculativeConfig._maybe_override_draft_max_model_len).
- DSpark proposes a whole block: "num_speculative_tokens must be at least 5 (check the checkpoint's config.json)",
  and "When DSpark is enabled, Prefill and Decode must use the same number of speculative tokens" (vllm-ascend
  docs/source/tutorials/models/DeepSeek-V4-Flash.md); other methods (MTP, EAGLE) run k = 1 on the prefill side
  (the same page for MTP; Kimi-K2.5.md's prefill/decode commands for EAGLE-3).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.npuops.ascend.plugins.plugin_utils import values

# what npu_fused_infer_attention_score takes per request in one decode step (1 + k query tokens)
MAX_QUERY_TOKENS = 16
# the smallest block a DSpark draft proposes (vllm-ascend DeepSeek-V4-Flash.md)
DSPARK_MIN_TOKENS = 5
# the fields of --speculative-config, in the order the Kimi-K3 tutorial writes them (section 5.2)
CONFIG_FIELDS = ("method", "model", "num_speculative_tokens", "draft_tensor_parallel_size", "max_model_len",
                 "draft_sample_method", "enforce_eager")
# draft preset fields that size it in the capacity plan (not part of the command)
SIZING_FIELDS = ("weights_bytes", "kv_cache_layers", "kv_elements_per_token_per_layer", "kv_cache_dtype")


class DraftError(Exception):
    pass


def draft_spec(presets, name, overrides=None, draft_dir=None):
    """The draft preset `name` with the inventory's npuops_draft_overrides, typed like the preset's values, and the
    directory it is mounted at on every node. DraftError names an unknown preset or field."""
    if name not in (presets or {}):
        raise DraftError("npuops_draft = %r is not a draft preset; use one of %s (or add one to npuops_draft_presets)"
                         % (name, ", ".join(sorted(presets or {})) or "none"))
    spec = dict(presets[name])
    for key, value in sorted((overrides or {}).items()):
        if key not in spec:
            raise DraftError("npuops_draft_overrides: %r is not a field of draft preset %s; the fields are %s"
                             % (key, name, ", ".join(sorted(spec))))
        # the draft's TP is a number or "target" (the preset's)
        like = 0 if key == "draft_tensor_parallel_size" and value != "target" else spec[key]
        try:
            spec[key] = values.convert_like(like, value)
        except ValueError as e:
            raise DraftError("npuops_draft_overrides: %s = %r: %s (the preset has %r)" % (key, value, e, spec[key]))
    spec["name"] = name
    spec["dir"] = draft_dir
    return spec


def draft_tp(draft, target_tp):
    """The draft's tensor parallel size on engines of `target_tp`: the preset's number, or the target's ("target")."""
    value = draft.get("draft_tensor_parallel_size", "target")
    return int(target_tp) if value in (None, "target") else int(value)


def prefill_tokens(draft):
    """k on the prefill side of a prefill/decode deployment: DSpark's block on both sides, 1 for the others."""
    if draft.get("prefill_num_speculative_tokens") not in (None, ""):
        return int(draft["prefill_num_speculative_tokens"])
    return int(draft["num_speculative_tokens"]) if draft.get("method") == "dspark" else 1


def problems(draft, target_max_model_len, groups):
    """Every rule the draft breaks on the engine groups of one instance (tier groups: name, tp, kv_role), each naming
    the rule and the fix. Empty when it may run."""
    out = []
    name = draft.get("name")
    k = draft.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or k <= 0:
        out.append("draft %s: num_speculative_tokens = %r: vLLM requires it to be greater than zero "
                   "(SpeculativeConfig); the tutorial's drafts use 7, Block5 uses 5" % (name, k))
        return out
    if k + 1 > MAX_QUERY_TOKENS:
        out.append("draft %s: num_speculative_tokens = %d: 1 + k = %d query tokens per request exceed the %d that "
                   "Ascend's fused attention takes (npu_fused_infer_attention_score TND layout, vllm-ascend's "
                   "decode_threshold assertion); use at most %d" % (name, k, k + 1, MAX_QUERY_TOKENS,
                                                                    MAX_QUERY_TOKENS - 1))
    if draft.get("method") == "dspark" and k < DSPARK_MIN_TOKENS:
        out.append("draft %s: num_speculative_tokens = %d: a DSpark draft proposes a block of at least %d tokens "
                   "(its checkpoint's config.json gives the block size; vllm-ascend's DSpark docs)"
                   % (name, k, DSPARK_MIN_TOKENS))
    length = draft.get("max_model_len")
    if length is not None and int(length) > int(target_max_model_len):
        out.append("draft %s: max_model_len %d is larger than the target's %d (vLLM refuses a draft longer than its "
                   "target); lower npuops_draft_overrides.max_model_len" % (name, int(length), int(target_max_model_len)))
    for g in groups:
        tp = draft_tp(draft, g["tp"])
        if tp not in (1, int(g["tp"])):
            out.append("draft %s: draft_tensor_parallel_size %d on group %s (TP%d): vLLM takes 1 or the target's "
                       "tensor parallel size; set npuops_draft_overrides.draft_tensor_parallel_size to %d or 1"
                       % (name, tp, g["name"], int(g["tp"]), int(g["tp"])))
    sides = set(g.get("kv_role") for g in groups)
    if "kv_producer" in sides:
        pk = prefill_tokens(draft)
        if draft.get("method") == "dspark" and pk != k:
            out.append("draft %s: the prefill side would run %d speculative tokens and the decode side %d: with DSpark "
                       "both sides use the same number (vllm-ascend's DSpark prefill/decode docs); remove "
                       "prefill_num_speculative_tokens" % (name, pk, k))
        elif draft.get("method") != "dspark" and pk != 1:
            out.append("draft %s: the prefill side runs 1 speculative token with %s (vLLM-Ascend's prefill/decode "
                       "commands), got %d" % (name, draft.get("method"), pk))
    return out


def config(draft, target_tp, kv_role=None):
    """--speculative-config of an engine of TP `target_tp` (its prefill side when kv_role is kv_producer)."""
    out = {}
    for key in CONFIG_FIELDS:
        if key == "model":
            out[key] = draft["dir"]
        elif key == "draft_tensor_parallel_size":
            out[key] = draft_tp(draft, target_tp)
        elif key == "num_speculative_tokens":
            out[key] = prefill_tokens(draft) if kv_role == "kv_producer" else int(draft[key])
        elif draft.get(key) is not None:
            out[key] = draft[key]
    return out


def sizing(draft, target_tp):
    """What the capacity plan counts of a draft on one die: {weights_bytes, kv_elements_per_token, kv_cache_dtype} (its
    KV cache sits in the same block pool as the target's: vLLM allocates the draft's layers there too)."""
    return {"weights_bytes": float(draft.get("weights_bytes") or 0) / draft_tp(draft, target_tp),
            "kv_elements_per_token": int(draft.get("kv_cache_layers") or 0)
            * int(draft.get("kv_elements_per_token_per_layer") or 0),
            "kv_cache_dtype": str(draft.get("kv_cache_dtype") or "auto")}
