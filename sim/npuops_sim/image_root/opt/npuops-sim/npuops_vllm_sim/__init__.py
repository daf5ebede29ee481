"""A strict stand-in for vLLM-Ascend's `vllm serve` (and `vllm bench serve`) for the npuops simulated cluster.

Test infrastructure, not vLLM: it implements what the rollout depends on and fails the way vLLM-Ascend
fails. Unknown flags and inconsistent parallel sizes are refused; the NPUs it is asked for must be visible
and their device nodes present; headless workers and DP ranks really connect to their leader's
master / DP RPC port and are refused on a duplicate rank; the leader's /health is 200 only once every rank
joined; /v1/models, chat and completions (reasoning split, tool calls, images, context limits, streaming)
and /metrics with vLLM's metric names are served; without /etc/hccn.conf a multi-node engine answers
garbage, and with Docker's 64 MB /dev/shm it dies as vLLM does. Standard library only.
"""
