"""What each node's last model check found, kept in its entry of the state directory's node findings."""

from __future__ import annotations

import threading
import time
from typing import Any

from . import statefile


class Kept:
    """What each node's last model check found, by key: the one source the put-off check asks (the actor's
    CheckImage(model_later=True)). Read from the node's findings in the state directory (statefile.NODES)
    once per node, then kept here and written back when it changes: a write that failed loses only the
    saving, and cannot put the check off into a loop of starts."""

    KEYS = 8  # keys kept per node

    def __init__(self, state_dir: str):
        self.state_dir = state_dir
        self._lock = threading.Lock()  # the nodes are checked at once
        self._nodes: dict[str, dict[str, int]] = {}

    def _of(self, node: str) -> dict[str, int]:
        if node not in self._nodes:
            self._nodes[node] = self._models(statefile.read_node(self.state_dir, node))
        return self._nodes[node]

    @staticmethod
    def _models(entry: dict[str, Any]) -> dict[str, int]:
        kept = entry.get("models")
        return dict(kept) if isinstance(kept, dict) else {}

    def _with(self, kept: dict[str, int], check_key: str, complete: bool) -> dict[str, int]:
        """``kept`` with this key's finding (complete: kept, the newest of KEYS; else gone)."""
        kept = {k: v for k, v in kept.items() if k != check_key}
        return dict(list(kept.items())[-(self.KEYS - 1):]) | {check_key: round(time.time())} if complete else kept

    def complete(self, node: str, check_key: str) -> bool:
        """The node's last model check for this key found the model complete."""
        with self._lock:
            return check_key in self._of(node)

    def note(self, node: str, check_key: str, complete: bool) -> None:
        """What a check found (complete or not); written only when the file says otherwise. OSError when it
        cannot be written (it is kept here all the same)."""
        with self._lock:
            kept = self._of(node)
            if complete != (check_key in kept):
                self._nodes[node] = self._with(kept, check_key, complete)
            # The file decides whether to write (another Kept of the same directory, a change's proof, may have
            # written this key since), and only this key changes in it: the other's keys stay.
            statefile.edit_node(self.state_dir, node, lambda was: was if complete == (check_key in self._models(was))
                                else {**was, "models": self._with(self._models(was), check_key, complete)})
