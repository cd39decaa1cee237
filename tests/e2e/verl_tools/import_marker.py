"""A model's ``external_lib`` for the e2e test: says, on stderr, in which process it was
imported (Ray prefixes the line with the actor's class and pid)."""

import os
import sys

print(f"import_marker: external_lib imported in pid {os.getpid()}", file=sys.stderr, flush=True)
