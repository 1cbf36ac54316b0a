import pytest

from fusekit.hw import load


def test_roofline_by_hand():
    h200 = load("h200")
    # 1 GFLOP fp32 at 67 TFLOP/s = 14.93 us; 1 GB at 4.8 TB/s = 208.3 us -> memory bound
    assert h200.roofline_s(1e9, 1e9, "fp32") == pytest.approx(1e9 / 4.8e12 + 4e-6)
    # 1 TFLOP bf16 over 1 MB: compute bound, 1e12 / 989.4e12 s
    assert h200.roofline_s(1e12, 1e6, "bf16") == pytest.approx(1e12 / 989.4e12 + 4e-6)
    assert h200.ridge_flops_per_byte("fp32") == pytest.approx(67e12 / 4.8e12)


def test_unknown_dtype_names_the_known_ones():
    with pytest.raises(KeyError, match=r"expected 'dtype' to be one of .*bf16.*\(got 'fp4'\)"):
        load("a100").peak("fp4")


def test_fingerprint_is_stable_and_distinguishes():
    assert load("h100").fingerprint() == load("h100").fingerprint()
    assert load("h100").fingerprint() != load("h200").fingerprint()
    assert load("edge").fingerprint() != load("cloud").fingerprint()


def test_to_dict_round_trips_through_json():
    import json

    data = json.loads(json.dumps(load("edge").to_dict()))
    assert data["kind"] == "accelerator"
    assert data["levels"][0]["name"] == "DRAM" and data["levels"][-1]["name"] == "SE"
    assert data["comet_arch"]["MemoryTypes"][-1]["attributes"]["parent_read_energy"] == 800
