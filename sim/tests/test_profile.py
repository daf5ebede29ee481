import pytest

from npuops_sim import plan, profile


@pytest.fixture
def healthy():
    node = plan.nodes(2, "a3")[1]
    return profile.build(node, "a3", plan.AddressPlan())


def test_a3_profile_has_eight_cards_of_two_chips_with_power_on_chip_zero_only(healthy):
    assert len(healthy["cards"]) == 8
    assert all(len(c["chips"]) == 2 for c in healthy["cards"])
    assert all((chip["power_w"] is None) == (chip["chip_id"] == 1) for c in healthy["cards"] for chip in c["chips"])
    assert sorted(ch["phy_id"] for c in healthy["cards"] for ch in c["chips"]) == list(range(16))


@pytest.mark.parametrize("fault,check", [
    ("link_down", lambda p: p["devices"]["7"]["link"] == "DOWN"),
    ("net_health_init", lambda p: p["devices"]["7"]["net_health"] == "Init"),
    ("tls_mismatch", lambda p: p["devices"]["7"]["tls_switch"] == 1),
    ("chip_alarm", lambda p: profile.chip_by_phy(p, 7)[1]["health"] == "Alarm"),
    ("chip_warning", lambda p: profile.chip_by_phy(p, 7)[1]["health"] == "Warning"),
    ("hbm_busy", lambda p: p["processes"][0]["npu_id"] == 3 and profile.chip_by_phy(p, 7)[1]["hbm_used_mb"] > 50000),
])
def test_device_faults_change_only_that_device(healthy, fault, check):
    faulty = profile.apply_fault(healthy, fault, device=7)
    assert check(faulty)
    assert faulty["faults"] == [{"fault": fault, "device": 7}]
    # other devices untouched, and the healthy profile was not modified in place
    assert faulty["devices"]["6"] == healthy["devices"]["6"]
    assert healthy["faults"] == []


def test_device_fault_without_device_is_refused(healthy):
    with pytest.raises(ValueError, match="DEVICE"):
        profile.apply_fault(healthy, "link_down")
    with pytest.raises(ValueError, match="unknown fault"):
        profile.apply_fault(healthy, "melted")


def test_old_driver_shows_in_version_info(healthy):
    faulty = profile.apply_fault(healthy, "old_driver")
    assert "Version=%s\n" % profile.OLD_DRIVER_VERSION in profile.version_info(faulty)
    assert profile.clear_faults(faulty, healthy)["driver_version"] == profile.DRIVER_VERSION


def test_hccn_conf_lists_every_device_by_physical_id(healthy):
    text = profile.hccn_conf(healthy)
    for phy, dev in healthy["devices"].items():
        assert "address_%s=%s\n" % (phy, dev["ip"]) in text
        assert "tls_enable_%s=0\n" % phy in text
