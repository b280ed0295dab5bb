"""What a fault's repair does to the phase: the budget and the backoff. Pure."""

from __future__ import annotations

from ..config import Config
from ..model import Action, Decision, Kind, Phase, Reason, Status

_REPAIR_PHASE = {"serve": Phase.STARTING_VLLM, "gang": Phase.CLEANING}


def repair(kind: str, reason: Reason, actions: tuple[Action, ...], st: Status, cfg: Config, now: float) -> Decision:
    """A fault's repair, within the budget and spaced by jittered exponential backoff."""
    h = cfg.healing
    if st.repairs_in_window >= h.repair_budget:
        return Decision(Phase.FAILED, Reason(Kind.RESTART_BUDGET_EXHAUSTED, f"{st.repairs_in_window} repairs in "
                        f"{h.repair_window / 3600:g}h; last fault: {reason}"), fatal=True)
    if now < st.next_repair_at:
        return Decision(Phase.BACKOFF, Reason(Kind.REPAIR_DELAYED, str(reason)))
    return Decision(_REPAIR_PHASE[kind], reason, actions, repair=kind)
