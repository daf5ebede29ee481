# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""The weight fan-out, planned on the controller: who relays to whom, and how the copies are doing.

The nodes form a chain in inventory order starting at the seed: each node pulls from the one before it,
falling back to the ones before that and finally the seed, so a failed node is routed around. Because a
node relays each piece as soon as it has checked it, the chain is pipelined: 1->N costs about one copy.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import json

from ansible.errors import AnsibleFilterError
from ansible_collections.npuops.ascend.plugins.module_utils import manifest as mf
from ansible_collections.npuops.ascend.plugins.plugin_utils.hostvars import hostvar


def weights_chain(hosts, seed):
    """The relay order: the seed first, then the other hosts in inventory order."""
    if seed not in hosts:
        raise AnsibleFilterError("weights_chain: the seed %r is not one of the hosts (%s)" % (seed, ", ".join(hosts)))
    return [seed] + [h for h in hosts if h != seed]


def weights_sources(chain, hostvars, port):
    """{host: [url of the node before it, the one before that, ..., the seed]} over npuops_fabric_ip."""
    urls = {}
    for h in chain:
        ip = hostvar(hostvars, h, "npuops_fabric_ip") or hostvar(hostvars, h, "npuops_node_ip")
        if not ip:
            raise AnsibleFilterError("weights_sources: host %s has neither npuops_fabric_ip nor npuops_node_ip" % h)
        urls[h] = "http://%s:%d" % (ip, int(port))
    return dict((h, [urls[chain[j]] for j in range(i - 1, -1, -1)]) for i, h in enumerate(chain))


def weights_servers(chain, receivers):
    """Nodes that must serve: every node upstream of the last receiver."""
    positions = [chain.index(r) for r in receivers if r in chain]
    return chain[:max(positions)] if positions else []


def _gb(n):
    return "%.1f" % (float(n or 0) / 1e9)


def copy_state(status):
    """running / done / failed from an async_status result. The role registers async_status with
    failed_when: false (to keep watching the other nodes), which hides `failed`; a finished weight_sync
    that succeeded always returns files_total, a failed one never does."""
    status = status or {}
    if not status.get("finished"):
        return "running"
    return "done" if "files_total" in status else "failed"


def weights_progress(hostvars, receivers):
    """One line per receiving node from its slurped sync-progress.json and its async status."""
    lines = []
    for h in receivers:
        status = hostvar(hostvars, h, "npuops_weights_status", {}) or {}
        raw = (hostvar(hostvars, h, "npuops_weights_progress", {}) or {}).get("content")
        p = {}
        if raw:
            try:
                p = json.loads(base64.b64decode(raw).decode("utf-8"))
            except (ValueError, TypeError):
                p = {}
        state = copy_state(status)
        if state == "running":
            state = p.get("state", "starting") if p.get("state") != "done" else "finishing"
        eta = p.get("eta_s")
        lines.append("%s: %s/%s files, %s/%s GB, %s MB/s, ETA %s (%s)" % (
            h, p.get("files_done", 0), p.get("files_total", "?"), _gb(p.get("bytes_done")), _gb(p.get("bytes_total")),
            p.get("mb_per_s", 0), ("%dm%02ds" % divmod(int(eta), 60)) if eta is not None else "-", state))
    return lines


def weights_done(hostvars, receivers, active=None):
    """Every copy ended; a receiver that dropped out of the play (failed, unreachable) has ended too."""
    if active is not None:
        receivers = [h for h in receivers if h in active]
    return all(copy_state(hostvar(hostvars, h, "npuops_weights_status")) != "running" for h in receivers)


def weights_summary(hostvars, receivers):
    """{host: {files_fetched, bytes_fetched, bytes_resumed, mb_per_s, seconds}} of the finished copies."""
    keys = ("files_fetched", "files_verified", "bytes_fetched", "bytes_resumed", "mb_per_s", "seconds")
    out = {}
    for h in receivers:
        status = hostvar(hostvars, h, "npuops_weights_status", {}) or {}
        out[h] = dict((k, status.get(k)) for k in keys)
    return out


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


def weights_listing_url(repo, source, revision):
    return mf.listing_url(source, repo, revision)


class FilterModule(object):
    def filters(self):
        return {"weights_chain": weights_chain, "weights_sources": weights_sources, "weights_servers": weights_servers,
                "weights_progress": weights_progress, "weights_done": weights_done, "weights_summary": weights_summary,
                "weights_copy_state": copy_state,
                "publisher_manifest": publisher_manifest, "weights_download_argv": weights_download_argv,
                "weights_listing_url": weights_listing_url}
