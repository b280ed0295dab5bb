"""A record of what runs and why (issue 25): each time a deployment reaches SERVING, what it ran on (each
member's host, GPU, fabric and image, the model, the serve as launched), what it came up with, and the
decisions since the record before; kept as a bounded history in its state directory. ``build`` makes one
(pure), ``diff`` compares two and says what changed since the last good one, ``state.records`` keeps them, ``text``
shows them, ``bundle`` puts them in a support bundle with the status, the logs' tails and the config."""

from .build import SERVING, UNKNOWN, Decided, Sources, build, scrub
from .diff import Change, diff, what_changed

__all__ = ["SERVING", "UNKNOWN", "Change", "Decided", "Sources", "build", "diff", "scrub",
           "what_changed"]
