"""How fast a load read its weights, beside how fast the node's disk reads, pure. The seed loaded 119 GiB in about
12 minutes (about 0.17 GB/s over two ranks) from an NVMe that reads several GB/s: a load far below its disk is
said, with the levers Spark owners use, never acted on."""

from __future__ import annotations

import re
from dataclasses import dataclass

GIB = 1 << 30
# vLLM's worker, once its rank's weights are in: "Model loading took 58.42 GiB memory and 712.3 seconds"
# ("... GiB and ..." before 0.11). The GiB are that rank's share of the checkpoint.
_LOADED = re.compile(r"Model loading took ([\d.]{1,12}) GiB(?: memory)? and ([\d.]{1,12}) seconds")
FAR_BELOW = 0.25  # a load reading at under a quarter of its disk's sequential rate is said to be slow
LEVERS = ("--load-format fastsafetensors in extra_args (eugr/spark-vllm-docker's recipe for Qwen3.5-122B-A10B-FP8 "
          "loads with it)", "the model on the node's own NVMe, not a network or USB mount",
          "the page cache dropped before the load ([memory] page_cache = \"drop\")")


@dataclass(frozen=True)
class LoadRead:
    """One rank's weights load, from its log line."""

    gib: float
    seconds: float

    @property
    def gb_s(self) -> float:
        return self.gib * GIB / 1e9 / self.seconds if self.seconds > 0 else 0.0


def loaded(text: str) -> LoadRead | None:
    """The last "Model loading took" line of a serve log (a rank's own); None: not logged (yet)."""
    found = None
    for m in _LOADED.finditer(text[-(1 << 20):]):
        try:
            found = LoadRead(float(m.group(1)), float(m.group(2)))
        except ValueError:  # "1.2.3": not a number, not a reading
            continue
    return found if found is not None and found.seconds > 0 and found.gib > 0 else None


def verdict(read: LoadRead | None, disk_gb_s: float | None) -> str:
    """"" when it cannot be judged (either figure unknown) or is not far below; else what to say."""
    if read is None or not disk_gb_s or disk_gb_s <= 0 or read.gb_s >= FAR_BELOW * disk_gb_s:
        return ""
    return (f"the load read {read.gb_s:.2f} GB/s, {read.gb_s / disk_gb_s:.0%} of the {disk_gb_s:.2f} GB/s the disk "
            f"reads: far below it; levers: {'; '.join(LEVERS)}")
