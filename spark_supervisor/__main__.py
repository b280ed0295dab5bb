"""`python -m spark_supervisor`: the same as the spark-supervisor command."""

import sys

from .cli import main

sys.exit(main())
