"""Layer 5: the supervisor's hands and eyes on the nodes, built on ``adapters``. ``observe`` (one
tick's observation of every node), ``act`` (an action carried out), ``backend`` (the Ray or mp backend
that composes them), ``prove`` (a change run in throwaway containers before it replaces what serves),
``diagnose`` (the `diagnose` command's checks), ``servelogs`` (the serve's logs on each node), ``perf``
(throughput measured and judged). Never imports ``plan`` (its peer) or anything above."""
