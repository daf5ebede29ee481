# -*- coding: utf-8 -*-
from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os

import pytest

from ansible_collections.npuops.ascend.plugins.module_utils import npu_smi

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "npu_smi")


def fixture(name):
    with open(os.path.join(FIXTURES, name)) as f:
        return f.read()


def test_a3_table_yields_sixteen_chips_with_power_only_on_chip_zero():
    info = npu_smi.parse_info(fixture("a3_info.txt"))
    assert info["npu_smi_version"] == "24.1.rc3.7"
    assert len(info["chips"]) == 16
    first, second, third = info["chips"][:3]
    assert first == {"card": 0, "chip": 0, "table_phy_id": 0, "name": "Ascend910", "health": "OK", "power_w": 178.8,
                     "temp_c": 36, "bus_id": "0000:9D:00.0", "aicore_pct": 0, "hbm_used_mb": 3397,
                     "hbm_total_mb": 65536}
    assert second["power_w"] is None and second["chip"] == 1 and second["hbm_used_mb"] == 3186
    assert third["card"] == 1 and third["bus_id"] == "0000:99:00.0"


def test_five_digit_hbm_without_space_and_the_process_row():
    info = npu_smi.parse_info(fixture("a3_info.txt"))
    busy = [c for c in info["chips"] if c["card"] == 2 and c["chip"] == 0][0]
    assert (busy["hbm_used_mb"], busy["hbm_total_mb"]) == (58959, 65536)
    assert info["processes"] == [{"card": 2, "chip": 0, "pid": 2268921, "name": "python3", "memory_mb": 55600}]


def test_widened_26_table_parses_the_same():
    info = npu_smi.parse_info(fixture("a3_info_wide_26.txt"))
    assert info["npu_smi_version"] == "26.0.rc2"
    assert len(info["chips"]) == 16
    assert info["chips"][0]["power_w"] == 162.6 and info["chips"][0]["temp_c"] == 34
    assert all(c["hbm_total_mb"] == 65536 for c in info["chips"])


def test_published_a2_table_with_unpadded_value_and_nameless_process():
    info = npu_smi.parse_info(fixture("a2_info_910b3_published.txt"))
    assert [c["name"] for c in info["chips"]] == ["910B3", "910B3"]
    assert info["chips"][1]["hbm_used_mb"] == 54592 and info["chips"][1]["table_phy_id"] is None
    assert info["processes"] == [{"card": 1, "chip": 0, "pid": 2268921, "name": None, "memory_mb": 51200}]


def test_mapping_by_header_names_skips_mcu_rows():
    chips = npu_smi.parse_mapping(fixture("a3_info_m.txt"))
    assert len(chips) == 16
    assert chips[3] == {"card": 1, "chip": 1, "logic_id": 3, "phy_id": 3, "name": "Ascend910"}


def test_mapping_with_non_zero_based_npu_ids():
    chips = npu_smi.parse_mapping(fixture("m_nonzero_ids.txt"))
    assert [(c["card"], c["chip"], c["logic_id"]) for c in chips] == [(8, 0, 0), (8, 1, 1), (9, 0, 2), (9, 1, 3)]


def test_mapping_of_910b4_names_with_spaces_and_no_phy_column():
    chips = npu_smi.parse_mapping(fixture("m_910b4.txt"))
    assert chips == [{"card": 0, "chip": 0, "logic_id": 0, "phy_id": 0, "name": "Ascend 910B4"},
                     {"card": 1, "chip": 0, "logic_id": 1, "phy_id": 1, "name": "Ascend 910B4"}]


def test_mapping_of_950_without_logic_column_uses_the_npu_id():
    chips = npu_smi.parse_mapping(fixture("m_950.txt"))
    assert [(c["card"], c["logic_id"], c["phy_id"]) for c in chips] == [(0, 0, 0), (1, 1, 1)]


def test_mapping_with_unknown_columns_is_refused():
    with pytest.raises(npu_smi.NpuSmiError, match="unknown columns"):
        npu_smi.parse_mapping("NPU ID  Chip ID  Temperature  Chip Name\n0  0  40  Ascend910\n")


@pytest.mark.parametrize("parse", [npu_smi.parse_info, npu_smi.parse_mapping, npu_smi.parse_list])
def test_dcmi_failure_is_a_clear_error(parse):
    with pytest.raises(npu_smi.NpuSmiError, match=r"driver is not usable.*-8005"):
        parse(fixture("dcmi_failure.txt"))


def test_list_counts_chips_per_card():
    assert npu_smi.parse_list(fixture("a3_info_l.txt")) == {i: 2 for i in range(8)}


def test_board_and_health_key_values():
    card = npu_smi.parse_key_values(fixture("a3_board_card.txt"))[0]
    assert card["Software Version"] == "25.5.1" and card["Firmware Version"] == "7.8.0.6.201"
    assert card["PCI Device ID"] == "0xD803"
    chip = npu_smi.parse_key_values(fixture("a3_board_chip.txt"))[0]
    assert chip["NPU Name"] == "9392" and chip["Chip Name"] == "Ascend910"
    assert npu_smi.parse_key_values(fixture("a3_health_alarm.txt"))[0]["Health Status"] == "Alarm"


def test_facts_join_table_map_and_versions():
    facts = npu_smi.build_facts(
        npu_smi.parse_info(fixture("a3_info.txt")), npu_smi.parse_mapping(fixture("a3_info_m.txt")),
        board=npu_smi.parse_key_values(fixture("a3_board_card.txt"))[0],
        driver_info=npu_smi.parse_assignments(fixture("version.info")),
        cann_info=npu_smi.parse_assignments(fixture("ascend_toolkit_install.info")))
    assert facts["generation"] == "A3" and facts["card_count"] == 8 and facts["chip_count"] == 16
    assert facts["chip_model"] == "Ascend910"
    assert facts["driver_version"] == "25.0.rc1.1" and facts["firmware_version"] == "7.8.0.6.201"
    assert facts["cann_version"] == "8.3.RC2" and facts["npu_smi_version"] == "24.1.rc3.7"
    assert [c["logic_id"] for c in facts["chips"]] == list(range(16))
    assert facts["chips"][5]["card"] == 2 and facts["chips"][5]["chip"] == 1 and facts["chips"][5]["phy_id"] == 5
    assert facts["processes"][0]["pid"] == 2268921


def test_facts_use_the_map_not_arithmetic():
    """Cards 8 and 9: logic ids come from -m; card*2+chip would give 16..19."""
    table = npu_smi.parse_info(fixture("a3_info.txt"))
    table["chips"] = [dict(c, card=c["card"] + 8) for c in table["chips"] if c["card"] < 2]
    facts = npu_smi.build_facts(table, npu_smi.parse_mapping(fixture("m_nonzero_ids.txt")))
    ids = [(c["card"], c["chip"], c["logic_id"]) for c in facts["chips"]]
    assert ids == [(8, 0, 0), (8, 1, 1), (9, 0, 2), (9, 1, 3)]
    assert facts["cann_version"] is None and facts["driver_version"] is None


def test_a2_facts():
    facts = npu_smi.build_facts(npu_smi.parse_info(fixture("a2_info.txt")),
                                npu_smi.parse_mapping(fixture("a2_info_m.txt")))
    assert facts["generation"] == "A2" and facts["chip_count"] == 8 and facts["chip_model"] == "910B3"


def test_table_and_map_that_disagree_are_refused():
    table = npu_smi.parse_info(fixture("a3_info.txt"))
    with pytest.raises(npu_smi.NpuSmiError, match="does not map"):
        npu_smi.build_facts(table, npu_smi.parse_mapping(fixture("m_nonzero_ids.txt")))


@pytest.mark.parametrize("a,b", [("24.1.rc3.7", "25.5.1"), ("8.3.RC2", "8.3.0"), ("8.5.1", "9.1.0"),
                                 ("25.0.rc1.1", "25.0.1")])
def test_version_order(a, b):
    assert npu_smi.version_tuple(a) < npu_smi.version_tuple(b)


def fake_npu_smi(tmp_path, body):
    """An executable npu-smi answering from the fixtures, as the real one does per argument list."""
    tool = tmp_path / "npu-smi"
    tool.write_text("#!/bin/sh\n" + body)
    tool.chmod(0o755)
    return str(tool)


A3_TOOL = """case "$*" in
  "info") cat {f}/a3_info.txt ;;
  "info -m") cat {f}/a3_info_m.txt ;;
  "info -t board -i 0") cat {f}/a3_board_card.txt ;;
  "info -t board -i 0 -c 0") cat {f}/a3_board_chip.txt ;;
  *) echo "Error: invalid parameter"; exit 2 ;;
esac
"""


def test_discover_runs_npu_smi_and_reads_the_version_files(tmp_path):
    toolkit = tmp_path / "toolkit"
    (toolkit / "aarch64-linux").mkdir(parents=True)
    (toolkit / "aarch64-linux" / "ascend_toolkit_install.info").write_text(fixture("ascend_toolkit_install.info"))
    driver = tmp_path / "driver"
    driver.mkdir()
    (driver / "version.info").write_text(fixture("version.info"))
    tool = fake_npu_smi(tmp_path, A3_TOOL.format(f=FIXTURES))
    facts = npu_smi.discover(npu_smi.runner(tool, 10), str(driver), str(toolkit))
    assert facts["generation"] == "A3" and facts["chip_count"] == 16 and facts["chip_model"] == "Ascend910"
    assert facts["driver_version"] == "25.0.rc1.1" and facts["cann_version"] == "8.3.RC2"
    assert facts["firmware_version"] == "7.8.0.6.201"
    assert [c["phy_id"] for c in facts["chips"]] == list(range(16))


def test_discover_without_version_files_takes_the_driver_from_the_board(tmp_path):
    tool = fake_npu_smi(tmp_path, A3_TOOL.format(f=FIXTURES))
    facts = npu_smi.discover(npu_smi.runner(tool, 10), str(tmp_path / "none"), str(tmp_path / "none"))
    assert facts["chip_count"] == 16 and facts["cann_version"] is None
    assert facts["driver_version"] == "25.5.1"  # the board's Software Version (a3_board_card.txt)


def test_runner_names_a_hung_a_failing_and_a_dcmi_npu_smi(tmp_path):
    hung = npu_smi.runner(fake_npu_smi(tmp_path, "exec sleep 60\n"), 1)
    with pytest.raises(npu_smi.NpuSmiError, match=r"npu-smi info did not answer within 1s: the driver may be wedged"):
        hung("info")
    failing = npu_smi.runner(fake_npu_smi(tmp_path, "echo 'Error: card id 3 is invalid.'; exit 2\n"), 5)
    with pytest.raises(npu_smi.NpuSmiError, match=r"npu-smi info -t board -i 3 failed \(rc=2\): Error: card id 3"):
        failing("info", "-t", "board", "-i", "3")
    dcmi = npu_smi.runner(fake_npu_smi(tmp_path, "cat %s/dcmi_failure.txt; exit 1\n" % FIXTURES), 5)
    with pytest.raises(npu_smi.NpuSmiError, match=r"npu-smi info failed: .*dcmi module initialize failed"):
        dcmi("info")


def test_locate_takes_the_given_path_else_searches_and_names_where_it_looked(tmp_path):
    tool = fake_npu_smi(tmp_path, "exit 0\n")
    seen = []

    def get_bin_path(name, opt_dirs=()):
        seen.append((name, list(opt_dirs)))
        return "/usr/local/sbin/npu-smi"

    assert npu_smi.locate(get_bin_path, tool) == tool and seen == []
    assert npu_smi.locate(get_bin_path, exists=lambda p: True) == "/usr/local/sbin/npu-smi"
    assert seen == [("npu-smi", ["/usr/local/bin", "/usr/local/sbin"])]
    with pytest.raises(npu_smi.NpuSmiError, match=r"npu-smi not found \(looked on PATH, /usr/local/bin, "
                                                  r"/usr/local/sbin\): install the Ascend driver"):
        npu_smi.locate(lambda name, opt_dirs=(): None)
    with pytest.raises(npu_smi.NpuSmiError, match=r"/usr/local/sbin, /opt/none/npu-smi\): .*or set npu_smi_path"):
        npu_smi.locate(get_bin_path, "/opt/none/npu-smi")
