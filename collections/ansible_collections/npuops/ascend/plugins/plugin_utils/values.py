# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Typed values from an inventory, where `-e name=false` arrives as the string "false".

The validator refuses what cannot be converted (naming the value and the fix); everything that reads a value
converts it with the same functions, so the string "false" is never taken for true.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible.module_utils.parsing.convert_bool import boolean


def to_bool(value):
    """True/False from a boolean or a string Ansible reads as one (true/false, yes/no, on/off, 1/0, ...), as the
    `bool` filter and role argument specs do; ValueError otherwise (no string is silently true)."""
    try:
        return boolean(value, strict=True)
    except TypeError:
        raise ValueError("%r is not a boolean" % (value,))


def to_number(value, kind=int):
    """An int (or float) from a number or a numeric string; ValueError otherwise (booleans are not numbers)."""
    if isinstance(value, bool):
        raise ValueError("%r is not a number" % (value,))
    if isinstance(value, (int, float)) and not (kind is int and isinstance(value, float) and value != int(value)):
        return kind(value)
    if isinstance(value, str):
        try:
            return kind(value.strip())
        except ValueError:
            pass
    raise ValueError("%r is not %s" % (value, "an integer" if kind is int else "a number"))


def convert_like(current, value):
    """`value` in the type of a preset's `current` value (the string "8" for an int field is 8; a mapping, a list or a
    field without a value takes it as it is); ValueError when it cannot be."""
    if value is None or current is None or isinstance(current, (dict, list)):
        return value
    if isinstance(current, bool):
        return to_bool(value)
    if isinstance(current, int):
        return to_number(value, int)
    if isinstance(current, float):
        return to_number(value, float)
    return str(value)


def number_problem(host, name, value, minimum=None, maximum=None, kind=int):
    try:
        n = to_number(value, kind)
    except ValueError:
        return "host %s: %s = %r is not %s" % (host, name, value, "an integer" if kind is int else "a number")
    if (minimum is not None and n < minimum) or (maximum is not None and n > maximum):
        return "host %s: %s = %s is outside [%s, %s]" % (host, name, n, minimum, maximum)
    return None
