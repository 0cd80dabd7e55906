"""`python -m services.trainer ...`: one rank of a training job (see services/trainer/shell.py)."""

import os
import sys

from services.trainer.shell import main

code = main(protect_stdout=True)
# Records are written unbuffered and checkpoints fsynced; skip the interpreter's teardown of
# torch, which takes 1-2 s, so a stopped rank frees its GPU as soon as its checkpoint is safe.
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
