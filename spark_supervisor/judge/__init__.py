"""Layer 4: pure judgements of what was read. ``logscan`` (the serve log), ``completion`` (a completion
or health answer), ``modelcheck`` (the model files), ``preflight`` (the fabric and image before a start),
``fabric`` (the transport in use), ``admission`` (the GPU memory asked for). Functions of their inputs: no
I/O, no clock. Imports the layers below (``specs`` for the names of what was run)."""
