from spark_supervisor.world.diagnose import Layer, NodeDiagnosis


def test_the_verdict_reads_bottom_up_from_the_first_layer_that_answers() -> None:
    engine_down = NodeDiagnosis("spark-2", (Layer("container", False, "?"), Layer("Docker engine", False, "x"),
                                            Layer("SSH", True, "ok")))
    assert engine_down.deepest_ok == "SSH" and engine_down.first_failing == Layer("Docker engine", False, "x")
    host_down = NodeDiagnosis("spark-2", (Layer("container", False, ""), Layer("Docker engine", False, ""),
                                          Layer("SSH", False, "timed out")))
    assert host_down.deepest_ok == "none" and host_down.first_failing is not None
    assert host_down.first_failing.name == "SSH"
    healthy = NodeDiagnosis("spark-1", (Layer("serve API", True, "200"),))
    assert healthy.first_failing is None and healthy.deepest_ok == "serve API"
