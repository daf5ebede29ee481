#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: weight_sync
short_description: Pull a verified copy of the model weights from peers
version_added: 0.1.0
description:
  - Fetches the manifest from the first peer that answers (or takes it from O(manifest)), skips files
    already here and verified, and fetches the rest, several files at a time, from the peers in O(src_url)
    order. The file is
    written to C(<file>.part), fsynced and renamed into place once every piece matched the seed's manifest
    (each piece's sha256 is checked as it arrives).
  - Bytes are written as they arrive, so this node's own server (M(npuops.ascend.weight_serve)) relays them
    to the next node at once; the next node checks every piece itself.
  - A copy that was killed resumes from its last checked piece. A peer that refuses connections, breaks
    them, or is frozen (sends nothing for O(peer_timeout) seconds and does not answer a ping) is routed
    around from the byte where it stopped, and stays demoted (asked last) with a backoff that doubles up to a
    minute, until it answers again. A piece that does not match is fetched once more, then the task fails
    naming the file, the piece and both digests. A full disk fails the task before any byte moves when the
    free space is short, or else with every C(.part) of the copy removed and nothing half-written renamed
    into place.
  - Each file comes in one request per peer; every byte is copied once from the socket into an aligned
    buffer, hashed there and written with C(O_DIRECT) (no copy into the page cache, no dirty pages), the files
    in flight on threads of their own so hashing and I/O spread over the node's cores.
  - On a file system without C(O_DIRECT) the bytes go through the page cache, where writeback of every piece
    starts as it is checked, and a few pieces later its pages are dropped, so a checkpoint larger than the node's
    memory is copied without a build-up of dirty pages. With O(keep_cache) or O(prewarm) they go through the
    page cache and stay there.
  - A second run with nothing changed moves no bytes and reports no change.
author:
  - npuops maintainers (@npuops)
options:
  src_url:
    description: Peers serving the weights (M(npuops.ascend.weight_serve)), most preferred first.
    type: list
    elements: str
    default: []
  token:
    description: The servers' token.
    type: str
  dest:
    description: The model directory on this node.
    type: path
    required: true
  manifest:
    description: The seed's manifest or its summary (from M(npuops.ascend.weight_manifest) with C(return_manifest));
      with it, check mode plans without any server running. The piece digests are fetched from the peers.
    type: dict
  parallel:
    description: Files fetched at the same time.
    type: int
    default: 4
  verify:
    description:
      - V(fast) trusts files verified by an earlier run while their size and mtime are unchanged.
      - V(full) re-hashes every file already here and fetches again the ones that do not match.
    type: str
    choices: [fast, full]
    default: fast
  stall_timeout:
    description: Seconds a piece may be unavailable from every peer before the copy fails.
    type: int
    default: 300
  peer_timeout:
    description:
      - Seconds a peer may send nothing before it is pinged; a peer that does not answer the ping either is
        routed around. A copy with a frozen or powered-off peer ends at most about this long (plus a
        3-second ping) later than without it.
    type: int
    default: 10
  keep_cache:
    description: Keep the pages the copy wrote in the page cache (what a prewarm wants) instead of dropping them.
    type: bool
    default: false
  run_id:
    description:
      - The id of the run this copy belongs to. While it runs the copy records itself (PID and run id) under
        O(run_dir), so M(npuops.ascend.weight_stop) can end it; its progress file names the run.
    type: str
    default: ""
  run_dir:
    description: Where the copy records itself while it runs.
    type: path
    default: /run/npuops
  prewarm:
    description: Read every file once after the copy, so the engine's weight load starts from the page cache.
    type: bool
    default: false
attributes:
  check_mode:
    description: Reports which files would be fetched and how many bytes, without fetching.
    support: full
  diff_mode:
    description: No diff; RV(files_to_fetch) lists what changes.
    support: none
notes:
  - While it runs it writes its progress (run id, files, bytes, MB/s of the last seconds, ETA) to
    C(<dest>/.npuops/sync-progress.json) every 2 seconds.
seealso:
  - module: npuops.ascend.weight_serve
  - module: npuops.ascend.weight_manifest
"""

EXAMPLES = r"""
- name: Pull the weights from the previous node of the chain, or the seed
  npuops.ascend.weight_sync:
    src_url: [http://10.214.1.100:18090, http://10.214.0.100:18090]
    token: "{{ weights_token }}"
    dest: /data/models/Kimi-K3-W4A8
  async: 14400
  poll: 0
  register: copy_job

- name: Re-hash everything here and repair what differs
  npuops.ascend.weight_sync:
    src_url: [http://10.214.0.100:18090]
    token: "{{ weights_token }}"
    dest: /data/models/Kimi-K3-W4A8
    verify: full
"""

RETURN = r"""
files_total:
  description: Files in the manifest.
  returned: always
  type: int
files_verified:
  description: Files already here and verified (not fetched).
  returned: always
  type: int
files_fetched:
  description: Files fetched in this run.
  returned: always
  type: int
files_to_fetch:
  description: The files that were (or, in check mode, would be) fetched.
  returned: always
  type: list
  elements: str
stray:
  description:
    - Files in O(dest) that the manifest does not list (an extra shard, a text file); an engine that loads every
      shard of the directory would load them. The module reports them; the weights role removes them when told.
  returned: always
  type: list
  elements: str
bytes_to_fetch:
  description: Their total size.
  returned: always
  type: int
bytes_fetched:
  description: Bytes received in this run.
  returned: always
  type: int
bytes_resumed:
  description: Bytes of interrupted copies kept (not fetched again).
  returned: when files were fetched
  type: int
seconds:
  description: Wall time.
  returned: always
  type: float
mb_per_s:
  description: Bytes fetched per second, in MB/s.
  returned: always
  type: float
peer_failures:
  description: The peers that were routed around, why, and when (seconds into the copy).
  returned: when files were fetched
  type: list
  elements: dict
  sample: [{"peer": "http://10.214.1.100:18090", "reason": "sent nothing for 10s and did not answer a ping", "at": 9.5}]
prewarm_seconds:
  description: Time spent reading the files into the page cache.
  returned: when O(prewarm=true)
  type: float
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.npuops.ascend.plugins.module_utils import transfer, weight_runs


def main():
    module = AnsibleModule(
        argument_spec=dict(
            src_url=dict(type="list", elements="str", default=[]),
            token=dict(type="str", no_log=True),
            dest=dict(type="path", required=True),
            manifest=dict(type="dict"),
            parallel=dict(type="int", default=4),
            verify=dict(type="str", choices=["fast", "full"], default="fast"),
            stall_timeout=dict(type="int", default=300),
            prewarm=dict(type="bool", default=False),
            peer_timeout=dict(type="int", default=10),
            keep_cache=dict(type="bool", default=False),
            run_id=dict(type="str", default=""),
            run_dir=dict(type="path", default="/run/npuops"),
        ),
        required_one_of=[("src_url", "manifest")],
        supports_check_mode=True,
    )
    p = module.params
    if p["src_url"] and not p["token"]:
        module.fail_json(msg="src_url needs the servers' token")
    record = None if module.check_mode else weight_runs.record_job(p["run_dir"], p["run_id"], p["dest"])
    try:
        result = transfer.sync(p["src_url"], p["token"] or "", p["dest"], manifest=p["manifest"],
                               parallel=p["parallel"], verify=p["verify"], check_only=module.check_mode,
                               stall_timeout=p["stall_timeout"], prewarm=p["prewarm"], peer_timeout=p["peer_timeout"],
                               keep_cache=p["keep_cache"], run_id=p["run_id"])
    except transfer.TransferError as e:
        module.fail_json(msg=str(e), dest=p["dest"])
    except (IOError, OSError) as e:
        module.fail_json(msg="copying into %s failed: %s" % (p["dest"], e), dest=p["dest"])
    finally:
        if record:
            weight_runs.forget_job(record)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
