import sys

from rlgrad.cli import main

sys.exit(main())
