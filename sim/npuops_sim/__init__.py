"""npuops_sim: the simulated Atlas A3/A2 cluster the npuops tests and `make demo` run against.

Test infrastructure. Each node is a network namespace plus a private mount namespace (its own /etc,
/usr/local, /dev, /run, /tmp, /root and /srv) with its own sshd; fake npu-smi/hccn_tool print the real
formats from the node's profile; podman runs containers per node. See sim/README.md.
"""
