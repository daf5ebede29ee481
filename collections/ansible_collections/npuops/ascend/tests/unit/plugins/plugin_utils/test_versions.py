"""The image <-> version table (data/images.yml) and what the planner refuses (plugin_utils/versions.py).

The expected values are what the real packages have (read in vllm 0.23.0 / 0.27.1 / 0.32.0 and vllm-ascend
v0.23.0 / main); the table is checked against them, not against itself."""
import pytest

from ansible_collections.npuops.ascend.plugins.plugin_utils import catalog, versions


@pytest.fixture(scope="module")
def presets():
    import os
    import yaml
    path = os.path.join(catalog.DATA_DIR, "..", "roles", "defaults", "defaults", "main", "presets.yml")
    with open(path) as f:
        return yaml.safe_load(f)["npuops_model_presets"]


@pytest.mark.parametrize("image,vllm,ascend", [
    ("quay.io/ascend/vllm-ascend:v0.23.0-a3", "0.23.0", "0.23.0"),
    ("m.daocloud.io/quay.io/ascend/vllm-ascend:v0.23.0-a3-openeuler", "0.23.0", "0.23.0"),
    ("quay.io/ascend/vllm-ascend:main-a3@sha256:0123", "0.27.1", "main"),
    ("quay.io/ascend/vllm-ascend:v0.32.0-a3", "0.32.0", "0.32.0"),
    # the images the user's documents name: the tutorial, the upstream Kimi-K3 page, the field report
    ("quay.io/ascend/vllm-ascend:nightly-main-a3", "0.27.1", "main"),
    ("vllm-ascend-kimi-k3:main", "0.27.1", "main"),
    ("quay.io/ascend/vllm-ascend:kimi-k3-a3", "0.23.0", "0.23.0"),
    ("quay.io/ascend/vllm-ascend:kimi-k3-a3-openeuler", "0.23.0", "0.23.0"),
    ("quay.io/ascend/vllm-ascend:kimi-k3", "0.23.0", "0.23.0"),
    ("quay.io/ascend/vllm-ascend:kimi-k3.1-pro-a3", "0.23.0", "0.23.0"),
])
def test_image_tag_gives_the_versions_the_image_carries(image, vllm, ascend):
    info = versions.image_versions(image)
    assert (info["known"], info["vllm"], info["vllm_ascend"]) == (True, vllm, ascend)
    assert info["min_driver"] == "25.5.0" and info["min_cann"] == "8.3.RC1"


def test_capabilities_follow_the_real_registries():
    old, k3, new = (versions.image_versions("x:" + t) for t in ("v0.23.0-a3", "main-a3", "v0.32.0-a3"))
    # kimi_k3 parsers and tokenizer mode arrived after 0.23.0 (vllm/reasoning, vllm/tool_parsers, TokenizerMode)
    assert "kimi_k3" not in old["reasoning_parsers"] and "kimi_k3" not in old["tool_call_parsers"]
    assert "kimi_k2" in old["reasoning_parsers"] and "kimi_k3" not in old["tokenizer_modes"]
    for info in (k3, new):
        assert {"kimi_k3"} <= set(info["reasoning_parsers"]) & set(info["tool_call_parsers"]) & \
            set(info["tokenizer_modes"])
    # no vLLM of the table has a plain int8 KV-cache dtype
    assert not any("int8" in i["kv_cache_dtypes"] for i in (old, k3, new))
    assert (old["bench_latencies"], k3["bench_latencies"], new["bench_latencies"]) == (False, False, True)
    assert "GET /v1/models" not in old["proxy_routes"] and "GET /v1/models" in k3["proxy_routes"]
    assert old["proxy_prefill_error"] == "500" and new["proxy_prefill_error"] == "upstream"


def test_the_k3_presets_need_the_main_line(presets):
    for name in ("kimi_k3_w4a8", "kimi_k3_1_pro_w4a8"):
        assert versions.preset_problems(presets[name], "quay.io/ascend/vllm-ascend:main-a3", name) == []
        problems = versions.preset_problems(presets[name], "quay.io/ascend/vllm-ascend:v0.23.0-a3", name)
        fields = sorted(p.split(" sets ", 1)[1].split(":", 1)[0] for p in problems)
        assert fields == ["reasoning_parser", "tokenizer_mode", "tool_call_parser"]
        for p in problems:
            assert "v0.23.0-a3" in p and "vLLM 0.23.0" in p and name in p and "main(-|$)" in p


def test_the_k3_images_serve_the_k3_presets_through_what_vllm_ascend_registers(presets):
    """vLLM 0.23.0 has no kimi_k3 parser or tokenizer mode; the K3 images' vllm-ascend registers them (the upstream
    Kimi-K3 page), so the presets plan with them and not with a stock v0.23.0 image."""
    digest = "sha256:" + "ab" * 32
    for image in ("quay.io/ascend/vllm-ascend:kimi-k3-a3", "quay.io/ascend/vllm-ascend:kimi-k3-a3-openeuler",
                  "quay.io/ascend/vllm-ascend:kimi-k3.1-pro-a3", "quay.io/ascend/vllm-ascend:kimi-k3-a3@" + digest,
                  "quay.io/ascend/vllm-ascend:nightly-main-a3"):
        for name in ("kimi_k3_w4a8", "kimi_k3_1_pro_w4a8"):
            assert versions.preset_problems(presets[name], image, name) == [], (image, name)
    info = versions.image_versions("quay.io/ascend/vllm-ascend:kimi-k3-a3@" + digest)
    assert info["digest"] == digest and info["tag"] == "kimi-k3-a3"
    assert info["vllm_ascend_registers"]["reasoning_parsers"] == ["kimi_k3"]
    assert "kimi_k3" not in versions.image_versions("x:v0.23.0-a3")["reasoning_parsers"]


def test_a_digest_alone_says_to_write_the_tag_before_it():
    problems = versions.preset_problems({}, "quay.io/ascend/vllm-ascend@sha256:" + "cd" * 32, "p")
    assert len(problems) == 1 and "a digest alone names no tag" in problems[0]
    assert "repository:tag@sha256:" in problems[0]


def test_int8_kv_cache_dtype_is_refused_with_the_c8_fix_except_on_the_image_that_ran_it():
    problems = versions.preset_problems({"kv_cache_dtype": "int8"}, "r/vllm-ascend:main-a3", "p")
    assert len(problems) == 1 and "--kv-cache-dtype int8" in problems[0]
    # the field report's image ran --kv-cache-dtype int8: it is the one the fix names
    assert "kimi-k3\\.1-pro" in problems[0] and "kv_cache_quant: C8" in problems[0]
    assert versions.preset_problems({"kv_cache_dtype": "int8"}, "r/vllm-ascend:kimi-k3.1-pro-a3", "p") == []


def test_an_unknown_tag_is_a_problem_naming_the_table():
    problems = versions.preset_problems({"reasoning_parser": "kimi_k3"}, "r/vllm-ascend:my-build", "p")
    assert len(problems) == 1 and "'my-build' is not in the image version table" in problems[0]
    assert versions.image_versions("r/vllm-ascend")["tag"] == "latest"


def test_what_an_image_really_holds_decides_what_it_serves():
    """The tutorial's command needs the kimi_k3 parsers and tokenizer mode: an image tagged main-a3 whose metadata
    says vLLM 0.23.0 cannot serve it, and the message names what was read and what is needed."""
    needs = {"reasoning_parser": "kimi_k3", "tool_call_parser": "kimi_k3", "tokenizer_mode": "kimi_k3"}
    held = {"vllm": "0.23.0", "vllm_ascend": "0.23.0", "torch_npu": "2.10.0.post4", "torch": "2.10.0", "cann": "9.1.0"}
    errors, warnings = versions.held_problems(needs, held, "q/vllm-ascend:main-a3", "the command of recipe r")
    assert len(errors) == 3
    assert errors[0].startswith("q/vllm-ascend:main-a3 holds vLLM 0.23.0, vllm-ascend 0.23.0, torch_npu 2.10.0.post4, "
                                "CANN 9.1.0 (read from the image): the command of recipe r needs --reasoning-parser "
                                "kimi_k3")
    assert warnings == ["q/vllm-ascend:main-a3 holds vLLM 0.23.0, its tag's line says 0.27.1: the tag was moved or the "
                        "image was built from elsewhere; pin the digest"]
    # the same versions under a K3 image's tag: its vllm-ascend registers the parsers (the upstream Kimi-K3 page)
    assert versions.held_problems(needs, held, "q/vllm-ascend:kimi-k3-a3", "c") == ([], [])
    # what the main line really holds serves it
    assert versions.held_problems(needs, dict(held, vllm="0.27.1", vllm_ascend="main"), "q/x:main-a3", "c") == ([], [])
    # a vLLM the table does not know: nothing checked, said so
    errors, warnings = versions.held_problems(needs, dict(held, vllm="0.99.0"), "q/x:main-a3", "c")
    assert errors == [] and "no entry for vLLM 0.99.0" in warnings[0]


def test_fabric_memory_needs_hdk_26_or_25_5_with_mooncake_0_3_11_and_cann_9():
    """vllm-ascend kv_pool.md (#14551), the 800 I/T A3 row: HDK >= 26.0 or HDK >= 25.5 with mooncake >= v0.3.11,
    CANN >= 9.0.0 (LingQu is not read)."""
    assert versions.fabric_mem_shortfall("26.0.1", "9.1.0", None) == []
    assert versions.fabric_mem_shortfall("25.5.1", "9.1.0", "0.3.11.post1") == []
    assert versions.fabric_mem_shortfall("25.5.1", "9.1.0", "0.3.10") == [
        "HDK 25.5.1 < 26.0 with Mooncake 0.3.10 < 0.3.11"]
    assert versions.fabric_mem_shortfall("25.5.1", "9.1.0", None) == [
        "HDK 25.5.1 < 26.0 and the image's Mooncake version could not be read (>= 0.3.11 needed below HDK 26.0)"]
    assert versions.fabric_mem_shortfall("24.1.rc3.7", "8.5.RC1", "0.3.11") == [
        "HDK 24.1.rc3.7 < 25.5", "CANN 8.5.RC1 < 9.0.0"]
    assert versions.fabric_mem_shortfall(None, None, "0.3.11") == [
        "its HDK (driver) version could not be read", "the image's CANN version could not be read"]


def test_a_jemalloc_preload_is_found_in_the_environment_and_in_the_preload_file():
    assert versions.jemalloc_preloads(None) == []
    assert versions.jemalloc_preloads({"env": "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2:", "file": None}) == [
        "LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2:"]
    assert versions.jemalloc_preloads({"env": "/lib/libfoo.so", "file": "/usr/lib64/libjemalloc.so.2\n"}) == [
        "/etc/ld.so.preload: /usr/lib64/libjemalloc.so.2"]


def test_each_image_names_its_line_and_what_the_lines_images_carry():
    info = versions.image_versions("quay.io/ascend/vllm-ascend:nightly-releases-v0.27.1rc-openeuler")
    assert (info["line"], info["vllm"], info["cann"], info["mooncake"], info["refuses_jemalloc"]) == (
        "0.27.1rc", "0.27.1", "9.1.0", "0.3.11.post1", True)
    assert versions.image_versions("quay.io/ascend/vllm-ascend:kimi-k3-a3")["line"] == "0.23.0"
    assert versions.image_versions("quay.io/ascend/vllm-ascend:nightly-main-a3")["refuses_jemalloc"] is False
    assert versions.image_versions("quay.io/ascend/vllm-ascend:nope")["line"] is None
    assert [versions.line_rank(x) for x in ("0.23.0", "0.27.1rc", "main", "0.32.0", "9.9")] == [0, 2, 3, 4, None]
