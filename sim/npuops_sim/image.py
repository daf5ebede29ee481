"""The simulated vLLM-Ascend image: a minimal Debian root made with mmdebstrap from this machine's own
apt sources, plus the simulator's in-container tools, imported into one shared podman image store that
every node lists under `additionalimagestores` (imported once, used by all nodes).

Cached outside the repository (`SIM_CACHE`, default /var/cache/npuops-sim): the Debian root is keyed on
the package list, the image on the root plus the simulator files, so a rebuild happens only when one
of them changes.
"""
import glob
import hashlib
import io
import os
import subprocess
import tarfile
import time

from . import paths

SUITE = "bookworm"
PACKAGES = ["python3", "iproute2", "iputils-ping", "procps"]
REPOSITORY = "localhost/npuops-sim/vllm-ascend"
# The tags the sim inventories use: -a3 for A3 nodes, none for A2, as the real image naming does.
ALIASES = ("v0.23.0-a3", "v0.23.0")
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


def image_files():
    """Files baked into the image: {path in image: (mode, bytes)}. The engine lives in npuops_sim.engine."""
    here = os.path.dirname(os.path.abspath(__file__))
    files = {}
    tools = os.path.join(here, "image_root")
    for root, _dirs, names in os.walk(tools):
        for name in sorted(names):
            if name.endswith(".pyc"):
                continue
            src = os.path.join(root, name)
            rel = os.path.relpath(src, tools)
            with open(src, "rb") as f:
                files["/" + rel] = (os.stat(src).st_mode & 0o777, f.read())
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
    """Make sure the sim image exists in the shared store; returns its full name. Idempotent."""
    write_store_config()
    base, base_key = base_rootfs(log)
    files = image_files()
    key = digest(base_key, sorted((k, v[0], v[1]) for k, v in files.items()))
    name = "%s:build-%s" % (REPOSITORY, key)
    if podman("image", "exists", name, check=False).returncode != 0:
        t0 = time.monotonic()
        log("image: importing %s" % name)
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
            podman("import", "--change", "WORKDIR /workspace", "--change", 'CMD ["/bin/bash"]',
                   "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                   layered, name)
        finally:
            os.unlink(layered)
        log("image: imported in %.1fs" % (time.monotonic() - t0))
    for alias in ALIASES:
        podman("tag", name, "%s:%s" % (REPOSITORY, alias))
    prune_old(name)
    return name


def prune_old(keep):
    """Remove earlier builds of our own repository (never anything else in the store)."""
    out = podman("images", "--format", "{{.Repository}}:{{.Tag}}", REPOSITORY, check=False).stdout or ""
    for ref in out.split():
        if ref.startswith(REPOSITORY + ":build-") and ref != keep:
            podman("rmi", ref, check=False)
