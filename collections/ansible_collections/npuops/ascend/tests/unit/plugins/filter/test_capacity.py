# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.npuops.ascend.plugins.filter import capacity


def test_published_kimi_k3_1_pro_point_on_two_a3(presets):
    """1.47 TB on 32 dies (TP16 x PP2): ~42.8 GiB of weights per die; at 0.90 the engine reported
    468,750 KV tokens (int8, block 768), i.e. at most 2 concurrent 200K sessions."""
    out = capacity.capacity_plan(presets["kimi_k3_1_pro_w4a8"], {"tp": 16, "pp": 2, "dp": 1}, 65536,
                                 contexts=[200000])
    assert out["weights_gib_per_die"] == 42.78
    assert abs(out["kv_tokens"] - 468750) / 468750 < 0.005
    assert out["sequences_at"][200000] == 2 and out["sequences_at_max_model_len"] == 2
    assert out["errors"] == []
    assert "only 2 sequences run at once" in out["warnings"][0]


def test_kimi_k3_does_not_fit_one_a2_node(presets):
    out = capacity.capacity_plan(presets["kimi_k3_w4a8"], {"tp": 8, "pp": 1, "dp": 1}, 65536)
    assert out["weights_gib_per_die"] > 170
    assert "does not fit on 8 dies" in out["errors"][0]
    assert out["kv_tokens"] == 0


def test_expert_parallel_spreads_the_experts_over_the_dp_group(presets):
    ep = capacity.capacity_plan(presets["kimi_k3_w4a8"], {"tp": 16, "pp": 1, "dp": 4, "expert_parallel": True})
    no_ep = capacity.capacity_plan(presets["kimi_k3_w4a8"], {"tp": 16, "pp": 1, "dp": 4})
    assert ep["weights_bytes_per_die"] < no_ep["weights_bytes_per_die"] / 3
    assert no_ep["errors"]  # 1.5 TB / 16 dies does not fit without EP
    assert ep["errors"] == [] and ep["kv_tokens"] > 0


def test_a_too_long_context_for_the_kv_cache_is_an_error(presets):
    out = capacity.capacity_plan(presets["kimi_k3_1_pro_w4a8"], {"tp": 16, "pp": 2, "dp": 1}, 65536,
                                 overrides={"max_model_len": 600000})
    assert "less than one sequence of max_model_len 600000" in out["errors"][0]


def test_overrides_change_the_estimate(presets):
    base = capacity.capacity_plan(presets["kimi_k3_1_pro_w4a8"], {"tp": 16, "pp": 2})
    more = capacity.capacity_plan(presets["kimi_k3_1_pro_w4a8"], {"tp": 16, "pp": 2},
                                  overrides={"gpu_memory_utilization": 0.94})
    assert more["kv_tokens"] > base["kv_tokens"]


def test_a_1m_context_fits_eight_a3_nodes_and_not_four_as_the_kimi_k3_page_says():
    """The vLLM-Ascend Kimi-K3 page (releases/v0.23.0, the note after section 5.1.1): "Serving a 1M-token context
    requires at least eight Atlas 800 A3 (64G x 16) nodes" (DP8, --max-model-len 1048576, 0.9)."""
    from ansible_collections.npuops.ascend.tests.unit.plugins.filter.helpers import rendered
    tier, model = rendered("8node_dp", "kimi_k3_w4a8")[:2]
    assert model["max_model_len"] == 1048576 and model["gpu_memory_utilization"] == 0.9
    assert capacity.capacity_problems(tier, model) == []
    assert capacity.capacity_plan(model, tier["groups"][0])["kv_tokens"] >= 1048576
    four, four_model = rendered("4node_dp", "kimi_k3_w4a8", "vllm_ascend_kimi_k3_4node_a3",
                                {"max_model_len": 1048576})[:2]
    problems = capacity.capacity_problems(four, four_model)
    assert len(problems) == 1, problems
    assert problems[0].startswith("tier 4node_dp, group main (TP16 x PP1 x DP4): the KV cache holds ")
    assert "on 64 dies, less than one sequence of max_model_len 1048576" in problems[0]
    assert "serving a 1M-token context requires at least eight Atlas 800 A3 (64G x 16) nodes (tier 8node_dp" \
        in problems[0]
    # the page's own four-node context fits
    assert capacity.capacity_problems(*rendered("4node_dp", "kimi_k3_w4a8", "vllm_ascend_kimi_k3_4node_a3")[:2]) == []
