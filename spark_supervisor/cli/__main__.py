"""`python -m spark_supervisor.cli`: the same as the spark-supervisor command (it was a module once)."""

import sys

from .main import main

sys.exit(main())
