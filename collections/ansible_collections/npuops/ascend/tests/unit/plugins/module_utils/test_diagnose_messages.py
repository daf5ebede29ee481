# -*- coding: utf-8 -*-
"""The messages the stack raises, read from the code that raises them (data/diagnose/signatures.yml, third round):
each line below is written as its source writes it (the values filled in), and gives the cause its source means; an
exception line is also read by the file that raised it (the traceback's last frame)."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import diagnose

V = "(EngineCore_DP0 pid=7) ERROR 12-05 01:02:03 [core.py:700] "


@pytest.fixture(scope="module")
def knowledge():
    return diagnose.load_signatures()


def top(knowledge, text):
    found = diagnose.analyze(diagnose.lines_of(text, source="t"), knowledge)
    assert found, text
    return found[0]


# (the line as its source writes it, the cause, the signature that names it)
MESSAGES = [
    # vllm/platforms/cuda.py check_if_supports_dtype
    ("ValueError: Bfloat16 is only supported on GPUs with compute capability of at least 8.0. Your Tesla V100 GPU has "
     "compute capability 7.0. You can use float16 instead by explicitly setting the `dtype` flag in CLI, for example: "
     "--dtype=half.", "config_invalid", "vllm_config_messages"),
    # vllm/config/model.py: a --max-model-len over the model's own
    ("ValueError: User-specified max_model_len (65536) is greater than the derived max_model_len (max_position_embeddings"
     "=32768 in model's config.json). To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1.",
     "config_invalid", "engine_args_rejected"),
    # torch_npu/npu/__init__.py _lazy_init in a forked child
    ("RuntimeError: Cannot re-initialize NPU in forked subprocess. To use NPU with multiprocessing, you must use the "
     "'spawn' start method", "config_invalid", "vllm_config_messages"),
    # vllm-ascend quantization/modelslim_config.py
    ("ValueError: ModelSlim Quantization Config Not Found You have enabled '--quantization ascend'",
     "config_invalid", "vllm_config_messages"),
    # pydantic over vllm/config/*.py: the header alone
    ("pydantic_core._pydantic_core.ValidationError: 1 validation error for SpeculativeConfig", "config_invalid",
     "vllm_config_pydantic_header"),
    # vllm/model_executor/models/registry.py
    ("ValueError: Model architecture MiniCPMV was supported in vLLM until v0.9.0 ... Model architecture Foo is not "
     "supported in-tree anymore. Please install the plugin at x", "model_unsupported", "vllm_model_messages"),
    # vllm/model_executor/model_loader/default_loader.py _prepare_weights
    ("RuntimeError: Cannot find any model weights with `/models/Qwen3-8B`", "model_path", "vllm_weights_missing"),
    ("FileNotFoundError: Weight files referenced in index but missing: ['model-00003-of-00004.safetensors']",
     "model_path", "vllm_weights_missing"),
    # vllm/transformers_utils/config.py get_config
    ("ValueError: Could not detect config format for no config file found. With config_format 'auto', ensure your model "
     "has either config.json (HF format) or params.json (Mistral format).", "model_path", "vllm_weights_missing"),
    # huggingface_hub errors / transformers utils/hub.py
    ("OSError: We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in the cached "
     "files.", "model_path", "hf_hub_unreachable_or_denied"),
    ("huggingface_hub.errors.GatedRepoError: 401 Client Error. Cannot access gated repo for url "
     "https://huggingface.co/meta-llama/x/resolve/main/config.json.", "model_path", "hf_hub_unreachable_or_denied"),
    # transformers utils/versions.py require_version
    ("ImportError: tokenizers>=0.21,<0.22 is required for a normal functioning of this module, but found "
     "tokenizers==0.19.1.", "version_incompatible", "transformers_too_old_or_new"),
    ("ImportError: This modeling file requires the following packages that were not found in your environment: "
     "flash_attn. Run `pip install flash_attn`", "version_incompatible", "transformers_too_old_or_new"),
    # vllm/tokenizers/registry.py
    ("ValueError: No tokenizer registered for tokenizer_mode='deepseek_v32'.", "parser_or_tokenizer",
     "tokenizer_files_missing"),
    # vllm/platforms/interface.py, vllm/v1/worker/gpu_worker.py
    ("RuntimeError: Physical device 9 for logical device 1 is not visible in ASCEND_RT_VISIBLE_DEVICES=0,1",
     "visible_devices", "vllm_devices_not_visible"),
    ("RuntimeError: No CUDA GPUs are available", "visible_devices", "vllm_devices_not_visible"),
    ("PermissionError: [Errno 13] Permission denied: '/dev/davinci3'", "visible_devices", "vllm_devices_not_visible"),
    # vllm/distributed/device_communicators/shm_broadcast.py
    ("RuntimeError: Insufficient space in /dev/shm: 1024 MiB required, 63 MiB free. Increase /dev/shm (e.g. --shm-size "
     "or --ipc=host).", "shm_too_small", "shm_broadcast_insufficient"),
    # vllm-ascend utils.py, device/device_config.py; torch_npu AclInterface.cpp, __init__.py
    ("ValueError: Invalid vllm version 0.1.dev1+gabc found. A dev version of vllm is installed probably.",
     "version_incompatible", "vllm_ascend_build_does_not_fit"),
    ("RuntimeError: Current device type: A3 does not match the installed version's device type: A2, please check your "
     "installation package.", "version_incompatible", "vllm_ascend_build_does_not_fit"),
    ("RuntimeError: Failed to find function aclmdlRICaptureBegin[ERROR] 2026-12-05-01:02:03 (PID:7, Device:0, "
     "RankID:-1)", "version_incompatible", "vllm_ascend_build_does_not_fit"),
    ("RuntimeError: Two accelerators cannot be used at the same time in PyTorch: npu and cuda.",
     "version_incompatible", "vllm_ascend_build_does_not_fit"),
    # vllm-ascend pyhccl_wrapper.py
    (V + "Failed to load HCCL library. so_file=libhccl.so, error=libhccl.so: cannot open shared object file",
     "driver_cann_mismatch", "hccl_library_not_loaded"),
    # vllm-ascend kv_transfer utils; vllm nixl
    ("RuntimeError: MemFabric TransferEngine initialization failed with ret_value=-1; hostname=node1 must be a numeric "
     "IPv4 address reachable by the peer", "kv_transfer", "ascend_kv_endpoint_config"),
    ("RuntimeError: NIXL compatibility hash mismatch. Local: abc, Remote: def. Prefill and decode instances have "
     "incompatible configurations.", "kv_transfer", "ascend_kv_endpoint_config"),
    ("(EngineCore_DP0 pid=7) ERROR 12-05 01:02:03 [p2p_nccl_engine.py:300] [PUT]Send Tensor, Timeout, peer 7",
     "kv_transfer", "kv_connector_logged_error"),
    ("(EngineCore_DP0 pid=7) ERROR 12-05 01:02:03 [memcache_backend.py:176] Failed to get 3 keys out of 8. Store is not "
     "initialized; call put() first to trigger initialization.", "kv_pool", "kv_pool_store_unreachable"),
    ("(EngineCore_DP0 pid=7) ERROR 12-05 01:02:03 [pool_worker.py:88] something went wrong", "kv_pool",
     "kv_pool_logged_error"),
    # Linux bind(2), getaddrinfo(3), vllm network_utils.py
    ("OSError: [Errno 99] Cannot assign requested address", "nic_or_ip_wrong", "address_not_this_nodes"),
    ("socket.gaierror: [Errno -2] Name or service not known", "nic_or_ip_wrong", "host_name_unresolved"),
    ("RuntimeError: Could not find open port after 20 attempts starting from port 8000", "port_in_use",
     "no_free_port"),
    # torch c10d socket.cpp
    ("[W1205 01:02:03.000000 socket.cpp:464] [c10d] The client socket has failed to connect to [10.0.0.1]:29500 "
     "(errno: 111 - Connection refused).", "dp_master_unreachable", "store_connection_refused"),
    ("ConnectionRefusedError: [Errno 111] Connection refused", "dp_master_unreachable", "connection_refused"),
    # the CUDA caching allocator, alloc_cpu.cpp, fork(2)
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 23.64 GiB",
     "npu_oom_load", "device_out_of_memory_other_runtimes"),
    ("RuntimeError: [enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried to "
     "allocate 1073741824 bytes. Error code 12 (Cannot allocate memory)", "host_oom", "host_memory_exhausted"),
    ("RuntimeError: can't start new thread", "host_oom", "host_memory_exhausted"),
    # glibc's loader, torch/_ops.py, pip, Python's imports
    ("ImportError: /lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.30' not found (required by "
     "/usr/local/lib/python3.10/site-packages/torch_npu/lib/libtorch_npu.so)", "version_incompatible",
     "library_version_not_found"),
    ("RuntimeError: operator torchvision::nms does not exist", "version_incompatible", "library_version_not_found"),
    ("ImportError: cannot import name 'AutoModelForVision2Seq' from 'transformers' (/usr/lib/python3/transformers/"
     "__init__.py)", "version_incompatible", "import_from_package_failed"),
    ("AttributeError: module 'numpy' has no attribute 'float'", "version_incompatible",
     "import_from_package_failed"),
    ("ModuleNotFoundError: No module named 'decorator'", "version_incompatible", "module_not_installed"),
    ("ImportError: libGL.so.1: cannot open shared object file: No such file or directory", "version_incompatible",
     "shared_library_missing"),
    ("ERROR: Could not find a version that satisfies the requirement torch-npu==2.9.0 (from versions: 2.1.0)",
     "version_incompatible", "pip_resolution_failed"),
    ("transformers 4.52.4 requires tokenizers<0.22,>=0.21, but you have tokenizers 0.19.1 which is incompatible.",
     "version_incompatible", "pip_resolution_failed"),
    # op-plugin's EXEC_NPU_CMD; SGLang's memory pool and TP balance checks
    ("RuntimeError: call aclnnFusedInferAttentionScoreV2 failed, detail:EZ1001: [PID: 7] 2026-12-05-01:02:03 get "
     "unsupported shape", "operator_error", "aclnn_call_failed"),
    ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: "
     "mem_fraction_static=0.6", "kv_cache_oom", "sglang_memory_pool"),
    ("RuntimeError: The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
     "pre_model_load_memory=19.2, local_gpu_memory=30.5", "npu_oom_load", "sglang_memory_unbalanced"),
    # after the third batch's first score: torch's store listen failure, vLLM's registry logging the import that failed,
    # vllm-ascend 0.7's quantizer, CANN's missing kernel binary, torch's MapAllocator, transformers' hub and GGUF,
    # vLLM 0.7-0.12's tokenizer and parallel checks, an unknown flag next to a parser flag
    ("RuntimeError: The server socket has failed to listen on any local network address. port: 29500, useIpv6: 0, "
     "code: -9", "port_in_use", "store_listen_failed"),
    ("ERROR 10-25 00:26:24 registry.py:272] ModuleNotFoundError: No module named 'transformers'\n"
     "ValueError: Model architectures ['LlamaForCausalLM'] are not supported for now.", "version_incompatible",
     "registry_import_failed"),
    ("NotImplementedError: There is no available ascend quantizer.", "version_incompatible", "ascend_quantizer_missing"),
    ("RuntimeError: call aclnnCast failed, detail:EZ9999: Inner Error!\n        Op Cast does not has any binary.",
     "driver_cann_mismatch", "op_kernel_binary_missing"),
    ("RuntimeError: unable to mmap 16933256392 bytes from file </root/model.safetensors>: Cannot allocate memory (12)",
     "host_oom", "host_memory_exhausted"),
    ("OSError: Incorrect path_or_model_id: '/data1/models/deepseek'. Please provide either the path to a local folder "
     "or the repo_id of a model on the Hub.", "model_path", "model_not_found"),
    ("RuntimeError: Failed to load the tokenizer. If the tokenizer is a custom tokenizer not yet available in the "
     "HuggingFace transformers library, consider setting `trust_remote_code=True`", "parser_or_tokenizer",
     "parser_unknown"),
    ("ValueError: GGUF model with architecture deci is not supported yet.", "model_unsupported",
     "vllm_model_messages"),
    ("  Value error, Tensor parallel size (16) cannot be larger than the number of available GPUs (8)",
     "visible_devices", "world_size_exceeds_devices"),
    ("vllm: error: unrecognized arguments: --enable-reasoning --reasoning-parser deepseek_r1", "config_invalid",
     "argparse_rejected"),
    # CUDA runtime and driver, NVIDIA Xid
    ("RuntimeError: The NVIDIA driver on your system is too old (found version 11040).", "driver_cann_mismatch",
     "gpu_driver_mismatch"),
    ("[Fri Dec  5 01:02:03 2026] NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.",
     "npu_device_fault", "gpu_device_fault"),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", "operator_error",
     "gpu_illegal_memory_access"),
]


@pytest.mark.parametrize("line, cause, signature", MESSAGES, ids=[m[2] + "-%d" % i for i, m in enumerate(MESSAGES)])
def test_a_message_as_its_source_raises_it_gives_its_cause(knowledge, line, cause, signature):
    f = top(knowledge, line)
    assert (f["cause"], f["signature"]) == (cause, signature), f


def test_every_message_signature_of_the_third_round_has_a_line_here(knowledge):
    ids = set(s["id"] for s in knowledge)
    assert set(THIRD) <= ids and set(FRAMES) <= ids
    assert set(THIRD) - set(m[2] for m in MESSAGES) == {"nccl_system_error_in_container"}  # its own test below


THIRD = ("vllm_config_messages", "vllm_config_pydantic_header", "vllm_model_messages", "vllm_weights_missing",
         "hf_hub_unreachable_or_denied", "transformers_too_old_or_new", "tokenizer_files_missing",
         "vllm_devices_not_visible", "shm_broadcast_insufficient", "nccl_system_error_in_container",
         "vllm_ascend_build_does_not_fit", "hccl_library_not_loaded", "ascend_kv_endpoint_config",
         "kv_pool_store_unreachable", "kv_connector_logged_error", "kv_pool_logged_error", "address_not_this_nodes",
         "host_name_unresolved", "no_free_port", "store_connection_refused", "connection_refused",
         "device_out_of_memory_other_runtimes", "host_memory_exhausted", "library_version_not_found",
         "import_from_package_failed", "module_not_installed", "shared_library_missing", "pip_resolution_failed",
         "gpu_driver_mismatch", "gpu_device_fault", "gpu_illegal_memory_access", "aclnn_call_failed",
         "sglang_memory_pool", "sglang_memory_unbalanced", "store_listen_failed", "registry_import_failed",
         "ascend_quantizer_missing", "op_kernel_binary_missing")
FRAMES = ("raised_in_vllm_config", "raised_in_model_registry", "raised_in_kv_cache_sizing", "raised_in_kv_connector",
          "raised_in_kv_pool", "raised_in_parser_registry")


def test_vllm_without_a_platform_names_cann_or_the_devices_with_medium_confidence_only(knowledge):
    """vLLM's "Failed to infer device type" says no platform was found: torch_npu did not load (CANN's environment) or
    no device is in the container - the first at medium confidence, so a line that tells them apart outranks it."""
    found = top(knowledge, "RuntimeError: Failed to infer device type")
    assert (found["cause"], found["certainty"]) == ("driver_cann_mismatch", "medium")
    f = top(knowledge, "RuntimeError: Failed to infer device type\nImportError: libhccl.so: cannot open shared object "
                       "file: No such file or directory")
    assert (f["cause"], f["signature"]) == ("driver_cann_mismatch", "cann_library_missing"), f


def test_a_pydantic_value_error_line_is_an_error_line(knowledge):
    assert diagnose.is_error("  Value error, a check no signature knows failed [type=value_error]")
    assert top(knowledge, "  Value error, a check no signature knows failed [type=value_error]")["cause"] == "other"


def test_an_ambiguous_nccl_system_error_names_shared_memory_at_low_confidence_only(knowledge):
    """NCCL's "unhandled system error" in a container is most often /dev/shm, but not always (a buffer it could not
    register is another): the cause with a low confidence."""
    f = top(knowledge, "VllM: NCCLerror: unhandled system error (run withNCCL DEBUG=INFo for details)")
    assert (f["cause"], f["certainty"]) == ("shm_too_small", "low")


def test_a_refused_connection_never_outranks_gloos_own_interface_failure(knowledge):
    f = top(knowledge, "[rank8] Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/tcp/pair.cc:144] "
                       "timed out connecting: SO_ERROR: Connection refused, remote=[10.0.0.2]:43210")
    assert f["cause"] == "nic_or_ip_wrong", f


# ------------------------------------------------------------------------------------------ by the frame that raised


def traceback(frames, exception, prefix=V):
    lines = [prefix + "Traceback (most recent call last):"]
    for path, func in frames:
        lines += [prefix + '  File "%s", line 42, in %s' % (path, func), prefix + "    raise something(...)"]
    return "\n".join(lines + [prefix + exception]) + "\n"


SITE = "/usr/local/python3.11/lib/python3.11/site-packages/"


@pytest.mark.parametrize("path, exception, cause", [
    ("vllm/config/parallel.py", "ValueError: expert_placement_strategy 'ring' needs dp > 1", "config_invalid"),
    ("vllm/engine/arg_utils.py", "NotImplementedError: VLLM_USE_V1=1 is not supported with --foo.", "config_invalid"),
    ("vllm_ascend/ascend_config.py", "ValueError: dyntra_lb_config.mode must be one of ['a'], got b.", "config_invalid"),
    ("vllm/model_executor/models/registry.py", "ValueError: something about Foo the registry says", "model_unsupported"),
    ("transformers/models/auto/configuration_auto.py", "KeyError: 'qwen3_moe'", "model_unsupported"),
    ("vllm/v1/core/kv_cache_utils.py", "ValueError: a sizing message no signature knows", "kv_cache_oom"),
    ("vllm_ascend/distributed/kv_transfer/kv_p2p/mooncake_connector.py",
     "RuntimeError: Cannot resolve local KV metadata index 3 to a layer name.", "kv_transfer"),
    ("vllm_ascend/distributed/kvpool/pool_worker.py", "RuntimeError: Block IDs are not initialized for request 7",
     "kv_pool"),
    ("vllm/tool_parsers/abstract_tool_parser.py", "KeyError: 'hermes2'",
     "parser_or_tokenizer"),
])
def test_an_exception_a_file_of_one_cause_raised_gives_that_cause_with_medium_confidence(knowledge, path, exception,
                                                                                         cause):
    f = top(knowledge, traceback([(SITE + "vllm/entrypoints/cli/main.py", "main"), (SITE + path, "check")], exception))
    assert (f["cause"], f["certainty"]) == (cause, "medium"), f
    assert f["evidence"].endswith(exception)


def test_the_same_exception_raised_elsewhere_is_other(knowledge):
    f = top(knowledge, traceback([(SITE + "mypkg/serve.py", "check")], "ValueError: expert_placement_strategy 'ring' "
                                                                       "needs dp > 1"))
    assert f["cause"] == "other" and f["certainty"] == "low", f


def test_a_bug_in_a_configuration_file_is_no_refused_setting(knowledge):
    """An AttributeError or a wrong call in vllm/config is a package that does not fit, not a setting refused."""
    f = top(knowledge, traceback([(SITE + "vllm/config/model.py", "__post_init__")],
                                 "AttributeError: 'Qwen3Config' object has no attribute 'rope_theta'"))
    assert f["cause"] != "config_invalid", f


def test_a_message_of_its_own_outranks_the_file_that_raised_it(knowledge):
    f = top(knowledge, traceback([(SITE + "vllm/config/parallel.py", "__post_init__")],
                                 "ValueError: World size (16) is larger than the number of available GPUs (8) in this "
                                 "node."))
    assert f["cause"] == "visible_devices" and f["certainty"] == "high", f


def test_an_excerpt_that_kept_only_the_last_frame_is_read_by_it(knowledge):
    text = ('  File "%svllm/config/scheduler.py", line 254, in _verify_args\n    raise ValueError(\n'
            "ValueError: long_prefill_token_threshold (9000) cannot be greater than the max_model_len (8192).\n" % SITE)
    assert top(knowledge, text)["cause"] == "config_invalid"


def test_a_frame_of_another_rank_does_not_name_this_ranks_exception(knowledge):
    text = ('(Worker_TP0 pid=1) ERROR 12-05 01:02:03 [multiproc_executor.py:1]   File "%svllm/config/model.py", line 1, '
            "in f\n(Worker_TP1 pid=2) ERROR 12-05 01:02:03 [multiproc_executor.py:1] ValueError: a message of rank 1\n"
            % SITE)
    assert top(knowledge, text)["cause"] == "other"
