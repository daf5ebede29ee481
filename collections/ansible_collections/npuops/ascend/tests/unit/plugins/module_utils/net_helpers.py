# -*- coding: utf-8 -*-
"""Loopback helpers shared by the unit tests."""
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import socket


def free_port():
    """A TCP port on 127.0.0.1 that nothing listens on (now)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port
