"""``python -m aml_ray.reference``: run the reference BM25 memory system (see :mod:`.server`)."""

import sys

from aml_ray.reference.server import main

sys.exit(main())
