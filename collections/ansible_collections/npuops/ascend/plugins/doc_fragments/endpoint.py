# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type


class ModuleDocFragment(object):
    # The options every module that talks to the served endpoint shares.
    DOCUMENTATION = r"""
options:
  url:
    description: Base URL of the endpoint (a vLLM API server, or the PD proxy in front of the engines),
      e.g. C(http://10.0.0.11:8000).
    type: str
    required: true
  api_key:
    description: The endpoint's API key, if it has one. Sent as a bearer token; never logged.
    type: str
"""
