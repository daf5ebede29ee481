# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
name: group_vars
version_added: 0.3.0
author:
  - npuops maintainers (@npuops)
short_description: group_vars and host_vars, with the file and line of a YAML error
requirements:
  - Enabled in configuration (C(vars_plugins_enabled = npuops.ascend.group_vars), in place of C(host_group_vars))
description:
  - ansible-core's own C(host_group_vars), which loads C(group_vars/) and C(host_vars/) beside the inventory and the
    playbook, unchanged, except for one thing - a file it cannot parse is reported with ansible-core's own error,
    which names the file, the line and the column and shows the source there.
  - ansible-core 2.19's C(host_group_vars) re-raises that error as text only (C(AnsibleParserError(to_native(e)))),
    so C(ansible-playbook) prints "YAML parsing failed" with no file and no line. This plugin raises the original
    error instead.
options:
  stage:
    description: When the variables are read (ansible-core's C(vars_plugin_staging)).
    type: str
    choices: [all, task, inventory]
    ini:
      - key: stage
        section: vars_host_group_vars
    env:
      - name: ANSIBLE_VARS_PLUGIN_STAGE
  _valid_extensions:
    default: [".yml", ".yaml", ".json"]
    description:
      - The extensions of the variable files.
    env:
      - name: ANSIBLE_YAML_FILENAME_EXT
    ini:
      - key: yaml_valid_extensions
        section: defaults
    type: list
    elements: string
"""

from ansible.errors import AnsibleError, AnsibleParserError
from ansible.plugins.vars.host_group_vars import VarsModule as HostGroupVars


class VarsModule(HostGroupVars):
    """ansible-core's host_group_vars does the work (its caches, its options); this one only lets its parser's error
    through whole."""

    @property
    def REQUIRES_ENABLED(self):
        # a collection's vars plugin is loaded only when enabled by name; ansible-core warns about the attribute the
        # builtin class carries, so this one has none
        raise AttributeError("REQUIRES_ENABLED")

    def get_vars(self, loader, path, entities, cache=True):
        try:
            return super(VarsModule, self).get_vars(loader, path, entities, cache=cache)
        except AnsibleParserError as e:
            cause = e.__context__
            # the parser's own error knows where (its obj is the origin: file, line, column)
            if isinstance(cause, AnsibleError) and getattr(cause, "obj", None) is not None:
                raise cause
            raise
