# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""recipe_document: the recipe (data/recipes) an inventory deploys. The logic lives in plugin_utils/recipes.py."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.errors import AnsibleFilterError

from ansible_collections.npuops.ascend.plugins.plugin_utils import recipes


def recipe_document(tier, model, name=None, image=None):
    """The recipe of a tier + model preset: `name` when given, else the one validated on the image's vLLM-Ascend line
    (data/images.yml)."""
    from ansible_collections.npuops.ascend.plugins.plugin_utils import versions
    try:
        return recipes.choose(name or None, tier, model, versions.image_versions(image)["line"] if image else None)
    except recipes.RecipeError as e:
        raise AnsibleFilterError("recipe_document: %s" % e)


class FilterModule(object):
    def filters(self):
        return {"recipe_document": recipe_document}
