"""`python -m harness.multi_gpu compare ...`: harness/multi_gpu/cli.py."""
import sys

from harness.multi_gpu.cli import main

sys.exit(main())
