"""Where the simulator keeps things on the machine (outside the repository)."""
import os

# Node-side paths: where a real Ascend host keeps these; the fake tools and the cluster agree on them.
PROFILE_IN_NODE = "/usr/local/Ascend/driver/lib64/npuops_sim/profile.json"
HCCN_TOOL_IN_NODE = "/usr/local/Ascend/driver/tools/hccn_tool"
NPU_SMI_IN_NODE = "/usr/local/bin/npu-smi"
MODELS_IN_NODE = "/srv/models"
# the static settings of the simulated cluster (model, engine, ...), next to the inventory it writes
SIM_GROUP_VARS = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "inventories", "sim",
                                              "group_vars"))

# the tier documents of the collection: the simulator writes inventories that match them
TIERS_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "collections", "ansible_collections",
                                         "npuops", "ascend", "data", "tiers"))

# podman on these machines: runc, no default ulimits (setting them fails in this sandbox), cgroupfs.
CONTAINERS_CONF = """[containers]
default_ulimits = []
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""


# what every container of a node gets besides its image (the node's container engine's default mounts, containers.conf
# `volumes`): the faults jemalloc_preload (a preload file) and old_mooncake (an older Mooncake transfer engine's
# package metadata over the image's)
CONTAINER_PRELOAD = "/etc/npuops-sim/ld.so.preload"
CONTAINER_MOONCAKE = "/etc/npuops-sim/mooncake"
# where the images keep the Mooncake transfer engine's package metadata (on every build's PYTHONPATH)
MOONCAKE_SITE = "/opt/npuops-sim/mooncake"
OLD_MOONCAKE = "0.3.10"


def containers_conf(volumes=()):
    """The node's containers.conf, with default volumes every container of the node gets."""
    if not volumes:
        return CONTAINERS_CONF
    return CONTAINERS_CONF.replace("[containers]\n", "[containers]\nvolumes = [%s]\n" % ", ".join(
        '"%s"' % v for v in volumes), 1)


def root():
    # absolute: the nodes boot from paths under it, whatever their working directory
    return os.path.abspath(os.environ.get("SIM_ROOT") or "/var/lib/npuops-sim")


def cache_dir():
    return os.environ.get("SIM_CACHE", "/var/cache/npuops-sim")


def image_store():
    return os.path.join(root(), "images")


def image_storage_conf():
    return os.path.join(root(), "images.storage.conf")


def image_containers_conf():
    return os.path.join(root(), "images.containers.conf")


def cluster_dir(prefix):
    return os.path.join(root(), "cluster-" + prefix)
