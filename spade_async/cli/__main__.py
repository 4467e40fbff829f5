import sys

from spade_async.cli.dispatch import main

sys.exit(main())
