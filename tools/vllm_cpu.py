"""Import before vllm: a vLLM installed from the registry's (CUDA) wheel with --no-deps detects its platform as the
CPU one, as vLLM's CPU build does.

vLLM 0.32 honours VLLM_TARGET_DEVICE=cpu; 0.23 and 0.27 only recognise the CPU build by its version string
("+cpu" in importlib.metadata.version("vllm"), vllm/platforms/__init__.py cpu_platform_plugin), so that is what
the installed package reports here. Only the command-line parser and the bench request functions are used."""
import importlib.metadata
import os

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
_version = importlib.metadata.version


def _cpu_version(name):
    found = _version(name)
    return found + "+cpu" if name == "vllm" and "cpu" not in found else found


importlib.metadata.version = _cpu_version
