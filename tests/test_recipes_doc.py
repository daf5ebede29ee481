"""docs/recipes.md is what the recipes and the deviations table say (tools/render_recipes_doc.py writes it)."""
import os
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))


def test_the_recipes_document_is_rendered_from_the_data():
    proc = subprocess.run([sys.executable, os.path.join(REPO, "tools", "render_recipes_doc.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with open(os.path.join(REPO, "docs", "recipes.md")) as f:
        doc = f.read()
    # every recipe and every deviation row is in it, with the tutorial's command verbatim
    for name in ("kimi_k3_tutorial_4node_a3", "gpuworks_kimi_k3_1_pro_2node_a3", "vllm_ascend_kimi_k3_4node_a3",
                 "vllm_ascend_kimi_k3_8p8d_a3", "listen_on_the_node_address", "vllm_host_ip", "no_memcache_pool_yet"):
        assert name in doc, name
    assert "--data-parallel-rpc-port $RPC_PORT" in doc and "export HCCL_BUFFSIZE=800" in doc
