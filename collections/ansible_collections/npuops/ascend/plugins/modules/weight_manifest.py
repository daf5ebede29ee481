#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: weight_manifest
short_description: Record the checksums of a model directory (the seed's manifest)
version_added: 0.1.0
description:
  - Walks a model directory and records, for every regular file, its size, its sha256 and the sha256 of
    each piece (so peers check every piece on arrival, and relay it while the rest of the file is still
    coming).
  - Reuses a recorded entry while the file's size and mtime are unchanged, so recording again after a
    verified copy costs one C(stat) per file.
  - Checks every C(.safetensors) file structurally (8-byte header length, JSON header, tensor offsets that
    end exactly at the end of the file), so a truncated file is caught without hashing it.
  - Optionally compares the digests with the publisher's list (ModelScope or Hugging Face per-file sha256).
author:
  - npuops maintainers (@npuops)
options:
  path:
    description: The model directory (or the tokenizer directory, copied the same way).
    type: path
    required: true
  setting:
    description: The inventory variable that names O(path), for the message when it does not exist.
    type: str
    default: npuops_model_dir
  manifest:
    description: Where to record the manifest. Default C(<path>/.npuops/manifest.json).
    type: path
  publisher_manifest:
    description:
      - "The publisher's digests, C({relpath: sha256}) (or C({relpath: {sha256: ...}})), as a dict or the path
        of a JSON file on the node. Files it lists that are missing or differ are returned in RV(mismatched)."
    type: raw
  fail_on_mismatch:
    description: Fail when RV(mismatched) is not empty or a safetensors file is broken.
    type: bool
    default: true
  piece_size:
    description: Bytes per piece (the unit peers check and relay).
    type: int
    default: 4194304
  parallel:
    description: Files hashed at the same time.
    type: int
    default: 4
  return_manifest:
    description: Return the manifest's summary (files with size and sha256, no piece digests) in RV(manifest_data),
      for the controller to plan the fan-out.
    type: bool
    default: false
attributes:
  check_mode:
    description: Hashes (read-only) and reports whether the manifest would change, without writing it.
    support: full
  diff_mode:
    description: The files added, removed or changed since the recorded manifest.
    support: full
seealso:
  - module: npuops.ascend.weight_serve
  - module: npuops.ascend.weight_sync
"""

EXAMPLES = r"""
- name: Record the seed's manifest and check it against the publisher's digests
  npuops.ascend.weight_manifest:
    path: /data/models/Kimi-K3-W4A8
    publisher_manifest: "{{ lookup('ansible.builtin.file', 'kimi-k3-sha256.json') | from_json }}"
  register: seed_manifest
"""

RETURN = r"""
manifest:
  description: Path of the recorded manifest.
  returned: always
  type: str
files:
  description: Number of files.
  returned: always
  type: int
total_bytes:
  description: Their total size.
  returned: always
  type: int
hashed:
  description: Files hashed in this run (the others were reused by size and mtime).
  returned: always
  type: int
bytes_hashed:
  description: Bytes hashed in this run.
  returned: always
  type: int
mismatched:
  description: Files whose sha256 differs from the publisher's (or that the publisher lists and are missing).
  returned: always
  type: list
  elements: dict
  sample: [{file: model-00001-of-00064.safetensors, ours: 3f2a..., theirs: 9c1b...}]
safetensors_errors:
  description: Broken safetensors files and what is wrong with each.
  returned: always
  type: dict
unindexed:
  description:
    - The C(*.safetensors) files that the checkpoint's index (C(model.safetensors.index.json)) does not name; they
      are left out of the manifest (not part of the checkpoint, never copied). Empty when there is no index.
  returned: always
  type: list
  elements: str
manifest_data:
  description: The manifest's summary (version, piece_size, files with size and sha256).
  returned: when O(return_manifest=true)
  type: dict
"""

import json
import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.npuops.ascend.plugins.module_utils import manifest as mf
from ansible_collections.npuops.ascend.plugins.module_utils.weight_server import manifest_path


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path", required=True),
            setting=dict(type="str", default="npuops_model_dir"),
            manifest=dict(type="path"),
            publisher_manifest=dict(type="raw"),
            fail_on_mismatch=dict(type="bool", default=True),
            piece_size=dict(type="int", default=mf.PIECE_SIZE),
            parallel=dict(type="int", default=4),
            return_manifest=dict(type="bool", default=False),
        ),
        supports_check_mode=True,
    )
    p = module.params
    root = p["path"]
    if not os.path.isdir(root):
        module.fail_json(msg="%s = %s does not exist on this node: put the files there first (the other nodes get "
                             "them from this one), or fix %s" % (p["setting"], root, p["setting"]))
    path = p["manifest"] or manifest_path(root)
    publisher = p["publisher_manifest"]
    if isinstance(publisher, str) and publisher:
        try:
            with open(publisher) as f:
                publisher = json.load(f)
        except (IOError, ValueError) as e:
            module.fail_json(msg="publisher_manifest %s: %s" % (publisher, e))
    try:
        previous = mf.load(path)
    except mf.ManifestError:
        previous = None  # recorded by another version: hash everything again
    unindexed = mf.unindexed_shards(root)
    try:
        data, stats = mf.build(root, previous, piece_size=p["piece_size"], parallel=p["parallel"], exclude=unindexed)
    except mf.ManifestError as e:
        module.fail_json(msg=str(e))
    if not data["files"]:
        module.fail_json(msg="%s holds no files: nothing to record" % root)
    mismatched = mf.compare_publisher(data, publisher) if publisher else []
    old_files = (previous or {}).get("files", {})
    changed = previous != data
    if changed and not module.check_mode:
        mf.save_json(path, data)
    result = dict(changed=changed, manifest=path, files=len(data["files"]), total_bytes=mf.total_bytes(data),
                  hashed=stats["hashed"], bytes_hashed=stats["bytes_hashed"], seconds=stats["seconds"],
                  mismatched=mismatched, safetensors_errors=stats["safetensors_errors"], unindexed=unindexed)
    if module._diff:
        result["diff"] = {
            "before": "\n".join(sorted("%s %s" % (r, e["sha256"]) for r, e in old_files.items())) + "\n",
            "after": "\n".join(sorted("%s %s" % (r, e["sha256"]) for r, e in data["files"].items())) + "\n",
        }
    if p["return_manifest"]:
        result["manifest_data"] = mf.summary(data)
    if p["fail_on_mismatch"] and (mismatched or stats["safetensors_errors"]):
        problems = ["%s: ours %s, publisher %s" % (m["file"], m["ours"], m["theirs"]) for m in mismatched[:10]]
        problems += ["%s: %s" % (r, why) for r, why in sorted(stats["safetensors_errors"].items())[:10]]
        module.fail_json(msg="the weights under %s are not what they should be: %s" % (root, "; ".join(problems)),
                         **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
