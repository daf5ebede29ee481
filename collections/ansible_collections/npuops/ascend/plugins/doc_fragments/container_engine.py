# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    # The option every module of the action group npuops.ascend.container shares (meta/runtime.yml): the roles set
    # it once with module_defaults on group/npuops.ascend.container.
    DOCUMENTATION = r"""
options:
  engine:
    description:
      - The container CLI on this host.
      - A member of the action group C(npuops.ascend.container), so C(module_defaults) on
        C(group/npuops.ascend.container) sets it for every module that runs containers.
    type: str
    choices: [docker, podman, isula]
    default: docker
"""
