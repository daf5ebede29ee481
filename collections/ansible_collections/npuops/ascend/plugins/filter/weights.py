# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The weight fan-out, planned on the controller: who relays to whom, which hosts failed, how long it takes.

The nodes form a chain, in the order of the play's hosts (every node of every instance), starting at the
seed: each node pulls from the one before it, falling back to the ones before that and finally the seed, so
a failed node is routed around. Because a node relays the bytes as they arrive (each receiver checks every
piece itself), the chain is pipelined: 1->N costs about one copy.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError
from ansible_collections.npuops.ascend.plugins.module_utils import manifest as mf
from ansible_collections.npuops.ascend.plugins.plugin_utils import results
from ansible_collections.npuops.ascend.plugins.plugin_utils.model import topology
from ansible_collections.npuops.ascend.plugins.plugin_utils.model.hostvars import table_default


def weights_chain(hosts, seed):
    """The relay order: the seed first, then the other hosts in inventory order."""
    if seed not in hosts:
        raise AnsibleFilterError("weights_chain: the seed %r is not one of the hosts (%s)" % (seed, ", ".join(hosts)))
    return [seed] + [h for h in hosts if h != seed]


def weights_sources(chain, hostvars, port):
    """{host: [url of the node before it, the one before that, ..., the seed]} over npuops_fabric_ip."""
    urls = {}
    for h in chain:
        ip = topology.fabric_ip(hostvars, h)
        if not ip:
            raise AnsibleFilterError("weights_sources: host %s has neither npuops_fabric_ip nor npuops_node_ip" % h)
        urls[h] = "http://%s:%d" % (ip, int(port))
    return dict((h, [urls[chain[j]] for j in range(i - 1, -1, -1)]) for i, h in enumerate(chain))


def weights_servers(chain, receivers):
    """Nodes that must serve: every node upstream of the last receiver."""
    positions = [chain.index(r) for r in receivers if r in chain]
    return chain[:max(positions)] if positions else []


# TCP/IP over Ethernet carries about 94% of the line rate as payload (1448 of 1538 bytes per full frame)
TCP_PAYLOAD_SHARE = 0.94


# a relay forwards what one read brought (64 KiB at least, more while the data flows) and looks for new bytes
# at most every 16 ms: what each hop of the chain adds before its downstream has the bytes
READ_MIN_BYTES = 64 * 1024
HOP_POLL_SECONDS = 0.016
HOP_READ_SECONDS = 0.02


# what plan.yml assumes when the inventory does not say (npuops_disk_write_mb_s, npuops_fabric_link_gbit): the
# sustained sequential write of one PCIe 4.0 NVMe data drive of an Atlas 800 A3, and a 400GbE fabric port
DEFAULT_DISK_WRITE_MB_S = table_default("npuops_disk_write_mb_s")
DEFAULT_LINK_GBIT = table_default("npuops_fabric_link_gbit")


def weights_copy_projection(total_bytes, nodes, disk_write_mb_s=None, link_gbit=None, parallel=4, start_seconds=2.0):
    """The expected time of the weight copy from one seed to `nodes` - 1 receivers along the pipelined chain.

    Every receiver takes the whole checkpoint once, at the slower of its disk and its link (each relay
    forwards as it receives, so the chain does not divide a link between receivers); each hop adds the time
    of one read of a stream plus a poll, and the copy starts after a couple of seconds (manifest,
    connections). -> {seconds, rate_mb_s, bound, per_hop_seconds, text}."""
    total_bytes, nodes = int(total_bytes), int(nodes)
    disk_write_mb_s = DEFAULT_DISK_WRITE_MB_S if disk_write_mb_s in (None, "") else disk_write_mb_s
    link_gbit = DEFAULT_LINK_GBIT if link_gbit in (None, "") else link_gbit
    disk = float(disk_write_mb_s) * 1e6
    link = float(link_gbit) * 1e9 / 8 * TCP_PAYLOAD_SHARE
    if disk <= 0 or link <= 0:
        raise AnsibleFilterError("weights_copy_projection: npuops_disk_write_mb_s and npuops_fabric_link_gbit must be "
                                 "positive, got %s and %s" % (disk_write_mb_s, link_gbit))
    rate = min(disk, link)
    receivers = max(nodes - 1, 0)
    per_hop = max(READ_MIN_BYTES * max(int(parallel), 1) / rate, HOP_READ_SECONDS) + HOP_POLL_SECONDS
    seconds = start_seconds + total_bytes / rate + max(receivers - 1, 0) * per_hop if receivers else 0.0
    bound = "disk write" if disk <= link else "link"
    text = ("weights: %.1f GB from the seed to %d node(s) along the chain, each at %.0f MB/s (%s bound: disk %.0f MB/s, "
            "link %s Gbit/s): about %dm%02ds" % (total_bytes / 1e9, receivers, rate / 1e6, bound, disk / 1e6,
                                                 link_gbit, int(seconds) // 60, int(seconds) % 60))
    return {"seconds": round(seconds, 1), "rate_mb_s": round(rate / 1e6, 1), "bound": bound,
            "per_hop_seconds": round(per_hop, 4), "text": text}


def weights_summary(hostvars, receivers):
    """{host: {files_fetched, bytes_fetched, bytes_resumed, mb_per_s, seconds}} of the finished copies."""
    keys = ("files_fetched", "files_verified", "bytes_fetched", "bytes_resumed", "mb_per_s", "seconds")
    out = {}
    for h in receivers:
        status = results.registered(hostvars, h, "npuops_weights_status", {}) or {}
        out[h] = dict((k, status.get(k)) for k in keys)
    return out


def weights_stray(hostvars, hosts, seed, need_key="npuops_weights_need", manifest_key="npuops_weights_manifest"):
    """'host: files (why)' for every host whose model directory holds files that are not part of the weights: on
    the seed, shards its checkpoint index does not name (left out of the manifest); elsewhere, files the seed's
    manifest does not list."""
    lines = []
    for h in hosts:
        if h == seed:
            files, why = (results.registered(hostvars, h, manifest_key, {}) or {}).get("unindexed") or [], \
                "not in the checkpoint's model.safetensors.index.json: left out of the manifest"
        else:
            files, why = (results.registered(hostvars, h, need_key, {}) or {}).get("stray") or [], "not in the seed's manifest"
        if files:
            more = " and %d more" % (len(files) - 20) if len(files) > 20 else ""
            lines.append("%s: %s%s (%s)" % (h, ", ".join(files[:20]), more, why))
    return lines


def publisher_manifest(listing, source):
    """The publisher's API listing -> {relpath: sha256} (see module_utils.manifest.publisher_listing)."""
    try:
        return mf.publisher_listing(source, listing)
    except mf.ManifestError as e:
        raise AnsibleFilterError(str(e))


def weights_download_argv(repo, source, revision, dest):
    try:
        return mf.download_argv(source, repo, revision, dest)
    except mf.ManifestError as e:
        raise AnsibleFilterError(str(e))


def weights_listing_url(repo, source, revision, endpoint=""):
    try:
        return mf.listing_url(source, repo, revision, endpoint)
    except mf.ManifestError as e:
        raise AnsibleFilterError(str(e))


def weights_hub_env(source, token="", endpoint=""):
    """The environment the vendor CLI reads its token and endpoint from (never its command line)."""
    try:
        return mf.hub_env(source, token, endpoint)
    except mf.ManifestError as e:
        raise AnsibleFilterError(str(e))


def weights_directories(model_dir, tokenizer_dir=""):
    """[{part, dir}]: the model directory, then the tokenizer directory when it lies outside it."""
    return [{"part": part, "dir": path} for part, path in mf.directories(model_dir, tokenizer_dir)]


def weights_sets(plan, play_hosts, nodes, seed, model_dir, tokenizer_dir="", draft_revision=""):
    """The weight sets the stage copies: one per model (and tokenizer) directory the plan's instances serve, then one
    per draft directory (npuops_draft: its checkpoint from its own repository at `draft_revision`), each to the nodes
    of the instances that use it and from its own seed (`seed` when it is one of them, else the first of them in play
    order): replicas on different weights never receive each other's. Without a plan, one set of `model_dir` over
    `nodes`. -> [{model_dir, tokenizer_dir, directories, instances, nodes, seed, kind}]; a draft set's directory
    carries its repository and revision."""
    sets = []
    if plan:
        by_dirs, drafts = {}, {}
        for name, inst in plan["instances"].items():
            model = inst.get("model") or {}
            hosts = [h for h in plan["hosts"] if plan["hosts"][h]["instance"] == name]
            dirs = (model.get("model_dir") or model_dir, model.get("tokenizer_dir") or "")
            if dirs not in by_dirs:
                by_dirs[dirs] = {"model_dir": dirs[0], "tokenizer_dir": dirs[1], "instances": [], "hosts": [],
                                 "kind": "model"}
                sets.append(by_dirs[dirs])
            by_dirs[dirs]["instances"].append(name)
            by_dirs[dirs]["hosts"].extend(hosts)
            draft = inst.get("draft")
            if draft:
                if draft["dir"] not in drafts:
                    drafts[draft["dir"]] = {"model_dir": draft["dir"], "tokenizer_dir": "", "instances": [],
                                            "hosts": [], "kind": "draft", "draft": draft}
                drafts[draft["dir"]]["instances"].append(name)
                drafts[draft["dir"]]["hosts"].extend(hosts)
        sets.extend(drafts.values())
    else:
        sets.append({"model_dir": model_dir, "tokenizer_dir": tokenizer_dir or "", "instances": [],
                     "hosts": list(nodes), "kind": "model"})
    out = []
    for one in sets:
        members = [h for h in play_hosts if h in one["hosts"]]
        if not members:
            continue
        if one["kind"] == "draft":
            directories = [{"part": "draft", "dir": one["model_dir"], "repo": one["draft"].get("repo") or "",
                            "revision": draft_revision or ""}]
        else:
            directories = weights_directories(one["model_dir"], one["tokenizer_dir"])
        out.append({"model_dir": one["model_dir"], "tokenizer_dir": one["tokenizer_dir"], "kind": one["kind"],
                    "directories": directories, "instances": one["instances"], "nodes": members,
                    "seed": seed if seed in members else members[0]})
    return out


class FilterModule(object):
    def filters(self):
        return {"weights_sets": weights_sets, "weights_stray": weights_stray, "weights_chain": weights_chain, "weights_sources": weights_sources,
                "weights_servers": weights_servers,
                "weights_summary": weights_summary, "weights_copy_projection": weights_copy_projection,
                "publisher_manifest": publisher_manifest, "weights_download_argv": weights_download_argv,
                "weights_listing_url": weights_listing_url, "weights_hub_env": weights_hub_env}
