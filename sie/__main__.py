import sys

from sie.cli import main

sys.exit(main())
