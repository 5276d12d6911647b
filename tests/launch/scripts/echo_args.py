"""Prints its arguments and the rank environment it was given (no torch: fast)."""

import json
import os
import sys

print(json.dumps({"argv": sys.argv[1:], **{k: os.environ.get(k) for k in (
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TRACEML_RUN_ID")}}))
