import sys

from hordeops_bridge.cli import main

sys.exit(main())
