"""A load's read rate beside its disk's (judge.loadrate): said when far below, with the levers; never guessed."""

from __future__ import annotations

from spark_supervisor.judge.loadrate import LoadRead, loaded, verdict

SEED = ("(RayWorkerWrapper pid=812, ip=192.168.200.13) INFO 12-02 10:14:03 [gpu_model_runner.py:2653] Model loading "
        "took 59.6123 GiB memory and 712.402113 seconds\n")


def test_the_seeds_load_is_far_below_an_nvme_and_says_the_levers() -> None:
    read = loaded("noise\n" + SEED)
    assert read == LoadRead(59.6123, 712.402113)
    assert round(read.gb_s, 3) == 0.09
    said = verdict(read, 3.2)
    assert said.startswith("the load read 0.09 GB/s, 3% of the 3.20 GB/s the disk reads: far below it; levers: "
                           "--load-format fastsafetensors")


def test_a_load_near_its_disk_or_any_figure_unknown_says_nothing() -> None:
    read = loaded("INFO Model loading took 58.4213 GiB and 30.5 seconds")  # before vLLM 0.11: no "memory"
    assert read is not None and round(read.gb_s, 2) == 2.06
    assert verdict(read, 3.2) == ""  # 64 % of the disk: not far below
    assert verdict(read, None) == "" and verdict(None, 3.2) == "" and verdict(read, 0.0) == ""
    assert loaded("Model loading took 1.2.3 GiB and 4 seconds") is None
    assert loaded("Model loading took 0 GiB memory and 0.0 seconds") is None
    assert loaded("") is None


def test_the_record_keeps_the_read_rate_beside_the_disk_and_the_verdict_when_far_below() -> None:
    from spark_supervisor.report.record.build import load_read
    read = LoadRead(59.6123, 712.402113)
    assert load_read(None, 3.2) == "unknown"
    assert load_read(read, None) == {"gib": 59.61, "seconds": 712.4, "gb_s": 0.09, "disk_gb_s": "unknown"}
    got = load_read(read, 3.2)
    assert isinstance(got, dict) and got["disk_gb_s"] == 3.2 and str(got["verdict"]).startswith(
        "the load read 0.09 GB/s, 3% of the 3.20 GB/s the disk reads: far below it")
