# -*- coding: utf-8 -*-
# Copyright: npuops contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
"""A bounded pool of threads over a list (hashing, copying and device checks are I/O or release the GIL)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import threading


def for_each(items, fn, parallel):
    """Call fn(item) for every item on up to `parallel` threads; -> results in item order.

    After the first exception no new item is started, and that exception is raised once all threads end.
    """
    items = list(items)
    results = [None] * len(items)
    errors = []
    lock = threading.Lock()
    pending = list(range(len(items)))

    def worker():
        while True:
            with lock:
                if not pending or errors:
                    return
                i = pending.pop(0)
            try:
                results[i] = fn(items[i])
            except Exception as e:  # pylint: disable=broad-except
                with lock:
                    errors.append(e)

    threads = [threading.Thread(target=worker) for dummy in range(max(1, min(int(parallel), len(items))))]
    for t in threads:
        t.daemon = True
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results
