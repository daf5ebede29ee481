# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading inventory variables in filters, which get `hostvars` whole."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import copy

from ansible_collections.npuops.ascend.plugins.plugin_utils import catalog

_TABLE_DEFAULTS = {}


def hostvar(hostvars, host, name, default=None):
    """`hostvars[host][name]`, or `default` when the host is unknown or the variable unset or null."""
    try:
        value = hostvars[host].get(name, default)
    except (KeyError, AttributeError):
        return default
    return default if value is None else value


def table_default(name):
    """The default of inventory variable `name` as its row in ``data/inventory_variables.yml`` states it: the one
    place a default is written (the roles' defaults, argument specs, docs and sample inventory are made from or
    checked against that row). KeyError for a variable the table gives no default. The table is read once per
    process."""
    if not _TABLE_DEFAULTS:
        _TABLE_DEFAULTS.update((n, row["default"]) for n, row in catalog.inventory_variables().items()
                               if "default" in row)
    return copy.deepcopy(_TABLE_DEFAULTS[name])


def setting(hostvars, host, name):
    """`hostvars[host][name]`, or the table's default when the host is unknown or the variable unset or null."""
    return hostvar(hostvars, host, name, table_default(name))
