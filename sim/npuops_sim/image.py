"""The simulated vLLM-Ascend image: a minimal Debian root made with mmdebstrap from this machine's own
apt sources, plus the simulator's in-container tools, imported into one shared podman image store that
every node lists under `additionalimagestores` (imported once, used by all nodes).

Cached outside the repository (`SIM_CACHE`, default /var/cache/npuops-sim): the Debian root is keyed on
the package list, the image on the root plus the simulator files, so a rebuild happens only when one
of them changes.
"""
import fcntl
import glob
import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
import time

import yaml

from . import paths

SUITE = "bookworm"
PACKAGES = ["python3", "iproute2", "iputils-ping", "procps"]
REPOSITORY = "localhost/npuops-sim/vllm-ascend"
# The tags of the simulated image: -a3 for A3 nodes, none for A2, as the real image naming does. Each emulates the
# vLLM / vllm-ascend versions the collection's image table (data/images.yml) gives its tag, and what its vllm-ascend
# registers. The sim inventories use the first pair (the main line, vLLM 0.27.1), or the tag of the image the tier's
# default recipe names when it is one of these (the field report's kimi-k3.1-pro-a3 for 2node_pp: its int8 KV).
ALIASES = ("main-a3", "main", "v0.23.0-a3", "v0.23.0", "v0.32.0-a3", "v0.32.0", "kimi-k3.1-pro-a3",
           "kimi-k3.1-pro-a3-openeuler", "v0.27.1rc1-a3", "nightly-releases-v0.27.1rc-a3")
TABLE = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "collections",
                     "ansible_collections", "npuops", "ascend", "data", "images.yml")
RECIPES = os.path.join(os.path.dirname(TABLE), "recipes")
VERSIONS_JSON = "/opt/npuops-sim/npuops_vllm_sim/versions.json"
DPKG_EXCLUDES = ["/usr/share/doc/*", "/usr/share/man/*", "/usr/share/locale/*", "/usr/share/info/*"]


def apt_sources():
    """This machine's enabled apt sources (deb822 and one-line files), as mmdebstrap reads on stdin."""
    texts = []
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")) + ["/etc/apt/sources.list"]:
        if os.path.isfile(path):
            with open(path) as f:
                texts.append(f.read())
    text = "\n\n".join(t.strip() for t in texts if t.strip())
    if not text:
        raise RuntimeError("no apt sources found in /etc/apt; mmdebstrap needs the machine's mirror")
    return text + "\n"


def version_table():
    """The collection's image <-> version table (data/images.yml)."""
    with open(TABLE) as f:
        return yaml.safe_load(f)


def emulated(tag, table=None):
    """{NPUOPS_SIM_VLLM_VERSION, NPUOPS_SIM_PROXY, NPUOPS_SIM_LINE, NPUOPS_SIM_VLLM_ASCEND_REGISTERS} an image tag
    claims (the first matching line of the table)."""
    table = table or version_table()
    for line in table["images"]:
        if re.search(line["tag_pattern"], tag):
            return {"NPUOPS_SIM_VLLM_VERSION": str(line["vllm"]), "NPUOPS_SIM_PROXY": str(line["proxy"]),
                    # the vLLM-Ascend release line (what it refuses: line_facts)
                    "NPUOPS_SIM_LINE": str(line.get("line") or line["vllm_ascend"]),
                    # field:name,name;field:name (no quotes or spaces: it travels as an image ENV)
                    "NPUOPS_SIM_VLLM_ASCEND_REGISTERS": ";".join(
                        "%s:%s" % (k, ",".join(v)) for k, v in sorted((line.get("vllm_ascend_registers") or {}).items()))}
    raise RuntimeError("the sim image tag %s has no line in %s" % (tag, TABLE))


def build_name(env):
    """One image per emulated version, proxy, release line and registrations (a short digest of them, when there are
    any)."""
    registers = env.get("NPUOPS_SIM_VLLM_ASCEND_REGISTERS", "")
    suffix = "-r" + hashlib.sha256(registers.encode()).hexdigest()[:8] if registers else ""
    return "%s-%s-l%s%s" % (env["NPUOPS_SIM_VLLM_VERSION"], env["NPUOPS_SIM_PROXY"], env["NPUOPS_SIM_LINE"], suffix)


def tier_tag(tier, generation):
    """The tag a simulated cluster of `tier` runs: its default recipe's image tag when the sim has it, else the
    generation's main line."""
    for name in sorted(os.listdir(RECIPES)) if tier else []:
        with open(os.path.join(RECIPES, name)) as f:
            doc = yaml.safe_load(f)
        tag = str(doc.get("image", "")).split("@", 1)[0].rsplit(":", 1)[-1]
        if doc.get("default") and doc.get("tier") == tier and tag in ALIASES:
            return tag
    return ALIASES[0] if generation == "a3" else ALIASES[1]


def image_files():
    """Files baked into the image: {path in image: (mode, bytes)}: the stand-in's tools, plus the version table
    as JSON (the image's python3 has no YAML) so the engine and proxy emulate what their version has."""
    here = os.path.dirname(os.path.abspath(__file__))
    files = {VERSIONS_JSON: (0o644, json.dumps(version_table(), sort_keys=True).encode())}
    tools = os.path.join(here, "image_root")
    for root, _dirs, names in os.walk(tools):
        for name in sorted(names):
            if name.endswith(".pyc"):
                continue
            src = os.path.join(root, name)
            rel = os.path.relpath(src, tools)
            with open(src, "rb") as f:
                files["/" + rel] = (os.stat(src).st_mode & 0o777, f.read())
    files.update(package_metadata())
    return files


SITE = "/opt/npuops-sim/site"  # + /<build>: on PYTHONPATH of that build only (its ENV)
POOL_SITE = "/opt/npuops-sim/pool"  # memcache_hybrid (the KV pool's MetaService and client), on every build's path
# what the vllm-ascend images carry besides vLLM and vllm-ascend (vllm-ascend v0.23.0 release notes: torch_npu
# 2.10.0.post4 on PyTorch 2.10.0; Dockerfile.a3: FROM quay.io/ascend/cann:9.1.0-a3-...)
TORCH, TORCH_NPU, CANN = "2.10.0", "2.10.0.post4", "9.1.0"


def package_metadata(table=None):
    """The package metadata each build carries, as an installed image does (what `pip show vllm vllm-ascend` and
    importlib.metadata read): vllm and vllm-ascend at the versions its line says, torch and torch_npu; the Mooncake
    transfer engine; and the CANN toolkit's install info (what vllm-ascend's collect_env.py reads)."""
    table = table or version_table()
    files = {"/usr/local/Ascend/ascend-toolkit/latest/x86_64-linux/ascend_toolkit_install.info":
             (0o644, ("package_name=Ascend-cann-toolkit\nversion=%s\n" % CANN).encode())}
    for alias in ALIASES:
        env = emulated(alias, table)
        line = next(x for x in table["images"] if re.search(x["tag_pattern"], alias))
        for name, dist, version in (("vllm", "vllm", line["vllm"]), ("vllm-ascend", "vllm_ascend", line["vllm_ascend"]),
                                    ("torch", "torch", TORCH), ("torch-npu", "torch_npu", TORCH_NPU)):
            path = "%s/%s/%s-%s.dist-info/METADATA" % (SITE, build_name(env), dist, version)
            files[path] = (0o644, ("Metadata-Version: 2.1\nName: %s\nVersion: %s\n" % (name, version)).encode())
    # vllm-ascend's Dockerfile: pip install mooncake-transfer-engine-npu (MOONCAKE_TAG); one version for every line of
    # the table (line_facts), kept on a path of its own so a node's older one can stand in for it (fault old_mooncake)
    found = sorted(set(str(f["mooncake"]) for f in (table.get("line_facts") or {}).values() if f.get("mooncake")))
    if len(found) != 1:
        raise RuntimeError("the simulated images carry one Mooncake; data/images.yml line_facts names %s" % found)
    files["%s/mooncake_transfer_engine_npu-%s.dist-info/METADATA" % (paths.MOONCAKE_SITE, found[0])] = (
        0o644, ("Metadata-Version: 2.1\nName: mooncake-transfer-engine-npu\nVersion: %s\n" % found[0]).encode())
    return files


def digest(*parts):
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else repr(part).encode())
    return h.hexdigest()[:16]


def podman(*args, check=True, capture=True):
    env = dict(os.environ, CONTAINERS_CONF=paths.image_containers_conf(),
               CONTAINERS_STORAGE_CONF=paths.image_storage_conf())
    return subprocess.run(["podman", *args], env=env, check=check, text=True,
                          stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE if capture else None)


def write_store_config():
    os.makedirs(paths.image_store(), exist_ok=True)
    with open(paths.image_storage_conf(), "w") as f:
        f.write('[storage]\ndriver = "overlay"\ngraphroot = "%s"\nrunroot = "%s"\n'
                % (paths.image_store(), paths.image_store() + ".run"))
    with open(paths.image_containers_conf(), "w") as f:
        f.write(paths.CONTAINERS_CONF)


def base_rootfs(log):
    key = digest(SUITE, PACKAGES, DPKG_EXCLUDES, apt_sources())
    tar = os.path.join(paths.cache_dir(), "debian-%s-%s.tar" % (SUITE, key))
    if os.path.exists(tar):
        return tar, key
    os.makedirs(paths.cache_dir(), exist_ok=True)
    log("image: building the Debian %s root with mmdebstrap (once; cached at %s)" % (SUITE, tar))
    tmp = tar + ".partial"
    cmd = ["mmdebstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES), "--format=tar"]
    cmd += ["--dpkgopt=path-exclude=%s" % p for p in DPKG_EXCLUDES]
    cmd += [SUITE, tmp, "-"]
    proc = subprocess.run(cmd, input=apt_sources(), text=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise RuntimeError("mmdebstrap failed (rc=%d): %s" % (proc.returncode, proc.stderr.strip()[-2000:]))
    os.replace(tmp, tar)
    for old in glob.glob(os.path.join(paths.cache_dir(), "debian-%s-*.tar" % SUITE)):
        if old != tar:
            os.unlink(old)
    return tar, key


def ensure(log=print):
    """Make sure the sim image exists in the shared store; returns its full name. Idempotent, and one at a time:
    clusters coming up side by side (test lanes) share the store."""
    os.makedirs(paths.root(), exist_ok=True)
    with open(os.path.join(paths.root(), "image.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _ensure(log)


def _ensure(log):
    write_store_config()
    base, base_key = base_rootfs(log)
    files = image_files()
    table = version_table()
    envs = dict((alias, emulated(alias, table)) for alias in ALIASES)
    key = digest(base_key, sorted((k, v[0], v[1]) for k, v in files.items()), sorted(envs.items()), POOL_SITE,
                 paths.MOONCAKE_SITE)
    name = "%s:build-%s" % (REPOSITORY, key)
    builds = dict((build_name(e), e) for e in envs.values())
    names = dict((b, "%s-%s" % (name, b)) for b in builds)
    if any(podman("image", "exists", n, check=False).returncode != 0 for n in names.values()):
        t0 = time.monotonic()
        log("image: importing %s (%s)" % (name, ", ".join(sorted(builds))))
        layered = os.path.join(paths.cache_dir(), "image-%s.tar" % key)
        with tarfile.open(base) as src, tarfile.open(layered + ".partial", "w") as dst:
            for member in src:
                if ("/" + member.name.lstrip("./")) in files:
                    continue
                dst.addfile(member, src.extractfile(member) if member.isreg() else None)
            for path, (mode, data) in sorted(files.items()):
                info = tarfile.TarInfo("." + path)
                info.size, info.mode, info.mtime = len(data), mode, 0
                dst.addfile(info, io.BytesIO(data))
        os.replace(layered + ".partial", layered)
        try:
            # one image per emulated version: the same files, the version in the image's environment (as the
            # real images differ by what they carry, not by how they are started)
            for build, env in sorted(builds.items()):
                changes = ["WORKDIR /workspace", 'CMD ["/bin/bash"]',
                           "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
                changes += ["ENV %s=%s" % kv for kv in sorted(env.items())]
                changes += ["ENV PYTHONPATH=%s/%s:%s:%s" % (SITE, build, paths.MOONCAKE_SITE, POOL_SITE)]
                podman("import", *[x for c in changes for x in ("--change", c)], layered, names[build])
        finally:
            os.unlink(layered)
        log("image: imported in %.1fs" % (time.monotonic() - t0))
    for alias, env in envs.items():
        podman("tag", names[build_name(env)],
               "%s:%s" % (REPOSITORY, alias))
    prune_old(set(names.values()))
    return names[build_name(envs[ALIASES[0]])]


def prune_old(keep):
    """Remove earlier builds of our own repository (never anything else in the store)."""
    out = podman("images", "--format", "{{.Repository}}:{{.Tag}}", REPOSITORY, check=False).stdout or ""
    for ref in out.split():
        if ref.startswith(REPOSITORY + ":build-") and ref not in keep:
            podman("rmi", ref, check=False)
