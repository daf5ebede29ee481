# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""image_versions / image_problems: the image <-> version table (data/images.yml) for playbooks.

The logic lives in plugin_utils/versions.py; these filters only read the collection's table.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.npuops.ascend.plugins.plugin_utils import versions


def image_versions(image):
    """The table line of an image: vLLM / vllm-ascend versions, driver and CANN minimums, capabilities."""
    return versions.image_versions(image)


def image_problems(containers):
    """What the engines' commands need that their image lacks (every host's image: npuops_image may differ per host),
    each problem once."""
    out = []
    for host, pair in sorted((containers or {}).items()):
        engine = (pair or {}).get("engine")
        if not engine:
            continue
        for p in versions.preset_problems(engine.get("needs") or {}, engine["image"],
                                          where="the command of recipe %s" % engine["recipe"]):
            if p not in out:
                out.append(p)
    return out


class FilterModule(object):
    def filters(self):
        return {"image_versions": image_versions, "image_problems": image_problems}
