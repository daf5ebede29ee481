# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Reading inventory variables in filters, which get `hostvars` whole."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


def hostvar(hostvars, host, name, default=None):
    """`hostvars[host][name]`, or `default` when the host is unknown or the variable unset or null."""
    try:
        value = hostvars[host].get(name, default)
    except (KeyError, AttributeError):
        return default
    return default if value is None else value
