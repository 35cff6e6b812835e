"""``python -m tests.hostlab {build-base,status,cleanup,bench,demo}``."""
import sys

from .lab import main

sys.exit(main())
