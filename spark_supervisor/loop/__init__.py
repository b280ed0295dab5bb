"""The loop: the process shell (``daemon``), the stack of one reconciler per deployment with its schedule,
pause and staged reloads (``stack``, ``pause``, ``reload``), the systemd and status-file reporter
(``reporting``), and one deployment's reconcile pass (``reconciler``) with its trackers (``tracking``)."""
