# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import pytest

from ansible_collections.npuops.ascend.tests.unit.plugins.filter import helpers


@pytest.fixture(name="presets")
def presets_fixture():
    return helpers.presets()
