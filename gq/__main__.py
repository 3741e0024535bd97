import sys

from gq.cli.main import main

sys.exit(main())
