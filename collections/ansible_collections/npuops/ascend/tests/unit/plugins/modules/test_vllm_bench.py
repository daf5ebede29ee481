# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

from ansible_collections.npuops.ascend.plugins.modules.vllm_bench import point_errors


def test_valid_points_pass():
    assert point_errors([
        {"name": "r-c1", "kind": "random", "concurrency": 1, "input_len": 8, "output_len": 8, "num_prompts": 4},
        {"name": "a-c1", "kind": "multi_turn", "concurrency": 1, "turns": 2, "output_len": 8, "context_tokens": 9},
    ]) == []


def test_every_problem_is_named_with_its_point():
    errors = point_errors([
        {"name": "r", "kind": "random", "concurrency": 0, "input_len": 8, "output_len": True, "num_prompts": 4},
        {"name": "r", "kind": "multi_turn", "concurrency": 1, "turns": 2, "output_len": 8, "context_tokens": 9},
        {"name": "bad name", "kind": "poisson"},
    ])
    assert "points[0] (r): concurrency must be a positive integer, not 0" in errors
    assert "points[0] (r): output_len must be a positive integer, not True" in errors
    assert "points[1] (r): the name is used twice" in errors
    assert any(e.startswith("points[2] (bad name): name must be") for e in errors)
    assert "points[2] (bad name): kind must be random or multi_turn, not 'poisson'" in errors
