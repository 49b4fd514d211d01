import sys

from cadence.cli import main

sys.exit(main())
